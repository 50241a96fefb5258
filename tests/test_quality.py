"""Output agreement (specdec.quality): several loops' greedy outputs against a reference's."""

from specdec.quality import check_identical


def test_greedy_check_catches_a_different_output():
    outputs = {
        "ar": {"p": [1, 2, 3]},
        "hf_plain": {"p": [1, 2, 3]},
        "hf_assisted": {"p": [1, 5, 3]},
        "hf_lookup": {"p": [1, 2]},
    }
    check = check_identical(outputs)
    assert not check["identical"]
    assert {(m["contender"], m["first_difference"]) for m in check["mismatches"]} == {
        ("hf_assisted", 1),
        ("hf_lookup", 2),
    }
    assert check["agreement"] == {"ar": 1.0, "hf_plain": 1.0, "hf_assisted": 1 / 3, "hf_lookup": 2 / 3}
