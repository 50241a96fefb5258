"""Where inductor keeps compiled graphs: the specdec cache folder, unless the user named another."""

import os

from torch._inductor.runtime.cache_dir_utils import default_cache_dir

from specdec.runtime.inductor import use_inductor_cache


def test_torchs_default_folder_gives_way_to_the_specdec_cache(monkeypatch, tmp_path):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR to torch's default: that counts as unset."""
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert use_inductor_cache() == str(tmp_path / "inductor") == os.environ["TORCHINDUCTOR_CACHE_DIR"]
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR")
    assert use_inductor_cache() == str(tmp_path / "inductor")


def test_a_folder_the_user_named_is_kept(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "specdec"))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert use_inductor_cache() == str(tmp_path / "mine") == os.environ["TORCHINDUCTOR_CACHE_DIR"]
