"""The Checkpoints pane's decisions, without a screen: what the dialogs propose (the verifier
from a report, the host's last one or a profile's command line; the held-out data), which
checkpoint's report a cursor move shows (a conversion in progress, an outcome pinned over a row,
a report cached per path and mtime), what a scan leaves behind, and the inspect report and a
training run's run.json parsed once into records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from console.checkpoints.model import CheckpointsModel, flag_value, matching
from console.checkpoints.results import Checkpoint, InspectReport, Tensor
from console.errors import TransportError
from console.hosts.host import Host
from console.runs.service import list_runs
from console.runs.watch import RunFeed
from console.scheduler.run_record import FinetuneSource, TrainRun, VocabRemap
from console.settings.config import LOCAL, Config, HostConfig, Profile
from tests.paths import FIXTURES
from tests.runs_registry import local_config, write_run

GPU = "gpu1"
A = Checkpoint("/r/runs/a/out/final", "run a", 100.0, 2048)
B = Checkpoint("/r/runs/b/out/best", "run b", 200.0, 4096)


def config(*profiles: tuple[str, str], demo: str | None = None) -> Config:
    """Hosts `local` and gpu1; each profile (host, command line) runs on its host."""
    return Config(hosts={LOCAL: HostConfig(name=LOCAL), GPU: HostConfig(name=GPU, ssh=GPU)},
                  profiles={f"p{i}": Profile(name=f"p{i}", hosts=[h], run=run)
                            for i, (h, run) in enumerate(profiles)}, demo=demo)


def report(verifier: str = "", **kw: object) -> InspectReport:
    return InspectReport.parse({"ok": True, "config": {"verifier": verifier}, **kw})


@pytest.mark.parametrize("command, want", [
    ("python -m engine train --target org/llama --data d", "org/llama"),
    ("python -m engine train --target=org/llama --data d", "org/llama"),
    ("python -m engine train --target '/models/my llama' --out o", "/models/my llama"),
    ("python -m engine train --targets x --out o", None),
    ("python -m engine train --data d --target", None),       # the flag without its value
    ("python -m engine train --target 'unbalanced", None),    # not a shell line
])
def test_flag_value_reads_a_profile_command_line(command: str, want: str | None) -> None:
    assert flag_value(command, "--target") == want


def test_the_verifier_proposed_comes_from_the_report_then_the_host_then_its_profiles() -> None:
    cfg = config((LOCAL, "engine train --target /m/local-target"),
                 (GPU, "engine train --out o"), (GPU, "engine train --target=org/gpu-target"))
    model = CheckpointsModel()
    assert model.known_verifier(GPU, A, cfg) == "org/gpu-target"   # the first that names one
    assert model.known_verifier("elsewhere", A, cfg) == ""
    model.gave_verifier(GPU, "org/served")
    model.gave_verifier(GPU, None)            # a convert without one forgets nothing
    assert model.known_verifier(GPU, A, cfg) == "org/served"
    assert model.known_verifier(LOCAL, A, cfg) == "/m/local-target"   # per host
    model.keep_report(A, report("org/from-config"))
    assert model.known_verifier(GPU, A, cfg) == "org/from-config"
    assert model.known_verifier(GPU, B, cfg) == "org/served"
    model.evaluated(GPU, "org/evaluated", "/d/held-out")
    assert model.known_verifier(GPU, B, cfg) == "org/evaluated"


def test_the_held_out_data_proposed_is_the_last_evaluated_else_the_local_demo_set() -> None:
    model = CheckpointsModel()
    cfg = config(demo="/w/demo")
    assert model.known_data(LOCAL, cfg) == "/w/demo/eval"
    assert model.known_data(GPU, cfg) == ""             # the demo lives on this machine only
    assert model.known_data(LOCAL, config()) == ""
    model.evaluated(LOCAL, "t", "/d/mine")
    assert model.known_data(LOCAL, cfg) == "/d/mine"


def test_a_report_is_kept_per_path_and_mtime() -> None:
    model = CheckpointsModel()
    model.keep_report(A, report("v"))
    assert model.report_of(A) is not None
    rewritten = Checkpoint(A.path, A.source, A.mtime + 1, A.bytes)
    assert model.report_of(rewritten) is None and model.report_of(B) is None


def test_a_cursor_move_inspects_once_and_never_during_a_conversion() -> None:
    model = CheckpointsModel()
    assert model.to_inspect(A) and model.shown_path == A.path
    assert not model.to_inspect(A)               # shown already: a rescan does not redo it
    assert model.to_inspect(A, again=True)       # i / enter
    model.begin_convert(A.path)
    assert model.converting == A.path and model.shown_path is None
    assert not model.to_inspect(B) and not model.to_inspect(B, again=True)
    assert model.refusal(B) == f"Busy converting {A.path}" and not model.may_poll()
    model.end_convert()
    assert model.refusal(B) is None and model.refusal(None) == "No checkpoint selected"
    assert model.may_poll() and model.to_inspect(B)
    model.scanning = True
    assert not model.may_poll()


def test_an_outcome_stays_over_its_row_until_the_cursor_moves_or_i_is_pressed() -> None:
    model = CheckpointsModel()
    assert model.to_inspect(A)
    model.show_outcome(A.path)                  # serve refused, or a swap done
    assert model.shown_path is None and not model.to_inspect(A)   # a rescan keeps it
    assert model.to_inspect(A, again=True) and model.pinned is None
    model.show_outcome(A.path)
    assert model.to_inspect(B) and model.pinned is None and model.shown_path == B.path
    assert model.to_inspect(A)                  # back on A: its report again
    model.show_outcome(None)                    # nothing under the cursor: pinned over no row
    assert model.to_inspect(A)


def test_after_a_conversion_the_result_is_listed_with_its_report_and_shown() -> None:
    model = CheckpointsModel()
    model.scanned(GPU, [A], [], "/r")
    dst = Checkpoint("/r/converted/a-vllm", "converted", 300.0, 2048)
    done = report("org/t", path=dst.path)
    model.rescanned(GPU, [A, dst], "/r/converted//a-vllm/", done)  # as the engine spelled it
    assert model.of(GPU).found == [A, dst] and model.report_of(dst) is done
    assert model.shown_path == "/r/converted//a-vllm/"
    assert matching([A, dst], "/r/converted/./a-vllm") == [dst]
    assert model.to_inspect(A) and model.to_inspect(dst)   # cached: shown without asking


def test_a_scan_records_what_it_found_and_a_failed_one_keeps_it() -> None:
    model = CheckpointsModel()
    assert model.empty_hint(GPU) is None                   # not scanned yet: not "none"
    model.scanned(GPU, [], [("/ckpts", "no such folder")], "/r")
    assert model.scans == 1 and model.of(GPU).root == "/r"
    assert model.empty_hint(GPU) == (
        "No checkpoints yet: the configured folder /ckpts: no such folder on gpu1; fix the "
        "host's `checkpoints = [...]`, or finish a training run.")
    assert model.empty_hint(LOCAL) == ("No checkpoints yet: list folders in the host's "
                                       "`checkpoints = [...]`, or finish a training run.")
    model.scanned(GPU, [A, B], [], "/r")
    assert model.empty_hint(GPU) is None and model.find(GPU, B.path) == B
    assert model.find(GPU, None) is None and model.find(LOCAL, B.path) is None
    model.scan_failed(GPU, TransportError(GPU, "connection refused"))
    assert model.scan_error is not None and model.scan_error.startswith("gpu1: ")
    assert model.of(GPU).found == [A, B]
    model.scanned(GPU, [A], [], "/r")
    assert model.scan_error is None and model.scans == 3


# -- the records the pane and the run detail draw ----------------------------------------------

def test_the_inspect_report_is_parsed_into_the_fields_the_view_draws() -> None:
    r = InspectReport.parse({
        "ok": True, "path": "/c/a", "format": "eagle", "style": "vllm", "key_style": "eagle",
        "config_style": "eagle", "weights": "safetensors", "files": ["model.safetensors"],
        "tensors": {"fc.weight": {"shape": [64, 192], "dtype": "bf16", "bytes": 24576},
                    "d2t": {"shape": [], "dtype": "i64", "bytes": "many"}, "junk": 3},
        "total_bytes": 24584,
        "config": {"hidden_size": 64, "draft_vocab_size": True, "aux_layer_ids": [1, 2, 3],
                   "rope_scaling": {"rope_type": "llama3"}, "rope_theta": 500000.0,
                   "torch_dtype": "bfloat16"},
        "provenance": {"written_by": "convert", "format": "vllm", "step": 150, "run": "/r/x"}})
    assert r.style_head == "vllm export of eagle format" and r.files == ("model.safetensors",)
    assert r.tensors == (Tensor("d2t", (), "i64", None), Tensor("fc.weight", (64, 192), "bf16",
                                                                 24576))
    s = r.summary
    assert (s.hidden_size, s.draft_vocab_size, s.aux_layers, s.rope_type, s.rope_theta,
            s.torch_dtype) == (64, None, "[1, 2, 3]", "llama3", 500000.0, "bfloat16")
    assert r.step == 150 and r.provenance[0] == ("written by", "convert, vllm style")
    assert ("run", "/r/x") in r.provenance


@pytest.mark.parametrize("prov", [[1, 2], "a string", 7])
def test_a_provenance_that_is_not_an_object_reads_as_none_recorded(prov: object) -> None:
    r = InspectReport.parse({"ok": False, "provenance": prov, "tensors": [1], "files": "x"})
    assert r.provenance == (("provenance", "none recorded (not written by this engine)"),)
    assert r.step is None and r.tensors == () and r.files == ()


def test_a_training_run_json_is_parsed_once_and_hostile_fields_read_as_unknown() -> None:
    fixture = FIXTURES / "runs" / "finetune.run.json"
    run = TrainRun.parse(json.loads(fixture.read_text(encoding="utf-8")))
    assert run is not None and run.engine == "0.1.0" and run.rebuild_vocab and not run.vocab
    assert run.finetune == FinetuneSource(
        "/data/demo/public-drafter", "eagle",
        "6bed35ef9908d95cf3bf65b356748edf70b4edc3cae426e2e533bde93eae6fb0",
        VocabRemap(160, 32, 0, 160, 192, numbers=(("kept", 160), ("new", 32), ("dropped", 0),
                                                   ("old_size", 160), ("new_size", 192))))
    assert TrainRun.parse({}) is None and TrainRun.parse([1]) is None
    odd = TrainRun.parse({"settings": [1], "finetune": {"sha256": {"w": 5}, "vocab_remap": {
        "kept": 1.5, "new": True, "note": "x"}}, "data_sha256": 0})
    assert odd == TrainRun(finetune=FinetuneSource(sha256="5", remap=VocabRemap(
        numbers=(("kept", 1.5),))))


HOSTILE_TRAIN_RUN = {"engine": "0.2.0", "settings": ["not", "an", "object"],
                     "finetune": {"path": "/d/src", "format": "eagle", "sha256": {"w": 12345},
                                  "vocab_remap": {"kept": 3, "new": "two"}},
                     "data_sha256": 7}


async def test_a_hostile_training_run_json_gives_provenance_rows_not_an_exception(
        tmp_path: Path) -> None:
    """A run.json whose settings are a list and whose digest is a number (a hand-edited file,
    another engine) still gives the run detail its rows, the odd fields as unknown."""
    run_dir = write_run(tmp_path, "finetune-9", [], status="succeeded", start=1.0, end=2.0,
                        exit_code=0, train_json=False)
    (run_dir / "out" / "run.json").write_text(json.dumps(HOSTILE_TRAIN_RUN), encoding="utf-8")
    host = Host(local_config(tmp_path).hosts[LOCAL])
    try:
        feed = RunFeed(host, (await list_runs(host, "finetune-9"))[0])
        await feed.load_provenance()
        assert feed.train_run is not None
        prov = dict(feed.provenance())
    finally:
        await host.close()
    assert prov["finetune"] == "/d/src (eagle, sha256 12345)"
    assert prov["remap"] == "kept 3"
    assert prov["vocab"] == "the checkpoint's / built from data (sha256 ?)"
    assert "engine 0.2.0" in prov["code"] and "target" not in prov and "data" not in prov
