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
