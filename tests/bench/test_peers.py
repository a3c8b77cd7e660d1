from pathlib import Path

from specdeploy.bench.peers import PeerConfig, Row, _results, markdown


def test_peer_ratios_pair_each_repeat_with_the_reference_and_show_their_spread():
    """The reference slowed in repeat 2 as much as the peer did: each repeat's ratio is 2x."""
    config = PeerConfig(bundles=(Path("a.plan"),), model=Path("m.gguf"), peers=())
    reference = Row("specdeploy fp32 plain", "", seconds=[1.0, 3.0, 1.2], outputs=[[1] * 8, [2] * 8])
    peer = Row("llama.cpp", "", seconds=[0.5, 1.5, 0.5], outputs=[[1] * 8, [2] * 7 + [3]])
    skipped = Row("optimum", "", skipped="not installed")
    results = _results(config, [reference, peer, skipped], ["chat", "qa"])
    rows = {r["runtime"]: r for r in results["rows"]}
    assert rows["llama.cpp"]["vs_reference"] == 2.0 and rows["llama.cpp"]["vs_reference_range"] == [2.0, 2.4]
    assert rows["llama.cpp"]["prompts_equal"] == 1 and rows["llama.cpp"]["seconds_per_repeat"] == [0.5, 1.5, 0.5]
    table = markdown(results)
    assert "| llama.cpp | 32.0 | 2.00× (2.00–2.40) |" in table and "skipped: not installed" in table
    assert "| specdeploy fp32 plain | 13.3 | 1.00× |" in table  # no spread against itself


def _two_rows(reference_seconds, peer_seconds):
    config = PeerConfig(bundles=(Path("a.plan"),), model=Path("m.gguf"), peers=())
    out = [[1] * 64] * 7
    rows = [Row("specdeploy int4 plain", "", seconds=reference_seconds, outputs=out),
            Row("llama.cpp", "", seconds=peer_seconds, outputs=out)]
    return _results(config, rows, ["chat"])


def test_a_run_whose_repeats_disagree_is_flagged_as_no_reading():
    """The figures of two runs on one VM (lab/notes/benchmarks-history.md): the first disturbed — plain's repeats
    8.7 / 12.4 / 10.7 s — the second steady; only the first carries the warning."""
    from specdeploy.bench.peers import unsteady

    disturbed = _two_rows([8.6785, 12.3606, 10.7106], [9.1575, 11.4566, 10.2294])
    steady = _two_rows([8.652, 8.9, 8.7], [9.83, 10.07, 9.97])
    assert "Unsteady run: specdeploy int4 plain's repeats took 8.7–12.4 s" in markdown(disturbed)
    assert unsteady(steady) is None and "Unsteady" not in markdown(steady)
    peer_moved = _two_rows([8.7, 8.8, 8.9], [8.0, 11.0, 8.9])  # the reference steady, the peer not
    assert "llama.cpp's ratio moved from 0.80× to 1.09×" in unsteady(peer_moved)
