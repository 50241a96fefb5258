"""A copy's c predicted from its linears (specdec.auto.linears, before the copy exists) against c measured on the
built copy as the calibration measures it (specdec.auto.calibration.measure_timings: its step over the target's,
interleaved), for each of the default pair's copies, on the compiled target of `make run`. Run from the repository
root: python docs/results/calibration/predicted_c.py [rounds]."""

import gc
import sys

import torch
from hydra import compose, initialize_config_dir

from experiments.run.app import Pairs, plan_of, setup_of
from experiments.run.jobs import CONF_DIR
from specdec.auto.calibration import measure_timings
from specdec.auto.linears import predicted_c
from specdec.auto.setup import calibration_ids
from specdec.draft.model import ModelDrafter
from specdec.runtime.machine import machine_sentence, machine, release_memory
from specdec.runtime.models import load_model

FORMS = {"dynamic_int8": {"quantization": "dynamic_int8"}, "bfloat16": {"dtype": "bfloat16"},
         "int8": {"quantization": "int8"}, "nf4": {"quantization": "nf4", "compute_dtype": "bfloat16"},
         "packed_int8": {"quantization": "packed_int8"}}  # fmt: skip

with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    cfg = compose(config_name="config", overrides=["logger=none", "~model.draft.candidates.dynamic_int8",
                                                   "~model.draft.candidates.nf4", "~model.draft.candidates.bfloat16",
                                                   "~model.draft.candidates.int8"])  # fmt: skip
plan = plan_of(cfg)
setup = setup_of(cfg, Pairs(), plan)
target, ids = setup.pair.target, calibration_ids(setup.pair.tokenizer, plan.chat)
print(machine_sentence(machine("cpu")), f"torch threads {torch.get_num_threads()}", flush=True)
for round_ in range(int(sys.argv[1]) if len(sys.argv) > 1 else 2):
    for name, form in FORMS.items():
        eager = form.get("quantization") != "packed_int8"  # the packed int8 copy compiles (runtime.drafts: false)
        c_predicted, ratio = predicted_c(target, ids, eager_copy=eager, **form)
        if eager:
            drafter = ModelDrafter(load_model(cfg.model.target.name, **form), reads_target_cache=True)
            timings = measure_timings(target, {name: drafter}, ids, widths=(1,))
            c_measured = f"{timings.draft_ms[name] / timings.step_ms:.2f}"
            del drafter
            release_memory()
        else:
            c_measured = "(the calibration's, compiled: see its table)"
        print(f"round {round_ + 1} {name}: R {ratio:.2f}, c predicted {c_predicted:.2f}, measured {c_measured}",
              flush=True)
    gc.collect()
