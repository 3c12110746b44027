"""The recipes: every one parses, and `granndis compare` runs each family side by side."""

import json

import pytest

from helpers import REPO, run
from lightning_granndis.cli import compare_table, run as cli_run

RECIPES = ["granndis_flx", "granndis_cob", "granndis_eas", "gnn_fb_base", "gnn_mb_base"]
GRANNDIS = str(REPO / ".venv" / "bin" / "granndis")


OPTIMUS_RECIPES = ["optimus_cc_baseline", "optimus_cc_cb", "optimus_cc_cb_fe_sc"]
#: what each family's printed config must contain
EXPECTED = {
    **{n: ("lightning_granndis.strategies.", "scale_to: rtx_a6000") for n in RECIPES},
    **{n: ("CompressedPipelineStrategy", "scale_to: a100_fp16", "lightning_granndis.models.GPT", "TextDataModule")
       for n in OPTIMUS_RECIPES},
    "pipe_bd_teacher": ("lightning_granndis.models.ImageClassifier", "export_path: runs/pipe_bd_teacher/teacher.pt"),
    **{f"pipe_bd_{v}": ("PipeBDStrategy", f"mode: {m}", "ImageBlockwiseDistillation", "ImageDataModule",
                        "teacher_weights: runs/pipe_bd_teacher/teacher.pt")
       for v, m in (("tr", "tr"), ("auto", "tr"), ("dna", "dna"), ("ls", "ls"))},
    **{f"vrd_{v}": ("VisualRelationshipModel", f"variant: {t}", "VisualGenomeDataModule", "RelationshipPredictionsPlot")
       for v, t in (("l", "L"), ("ls", "LS"), ("v", "V"), ("sv", "SV"), ("svw", "SVW"), ("ls_svw", "LS+SVW"))},
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_recipe_parses(name, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_run(["fit", "--config", str(REPO / "recipes" / f"{name}.yaml"), "--print_config"])
    assert exit_info.value.code in (0, None)
    printed = capsys.readouterr().out
    for text in EXPECTED[name]:
        assert text in printed


def record(mode, epochs, inter_bytes, val_acc):
    return {"mode": mode, "epochs": len(epochs), "metrics": {"val_acc": val_acc},
            "epoch_breakdown": epochs, "ledger": {"inter/halo": {"bytes": inter_bytes}, "inter/eval": {"bytes": 10**9}}}


def test_compare_table_averages_epochs_after_the_first():
    e = lambda total, inter: {"compute": total - inter, "intra_comm": 0.0, "inter_comm": inter,  # noqa: E731
                              "grad_sync": 0.0, "total": total}
    table = compare_table({
        "flx": record("flx", [e(9.0, 0.0), e(1.0, 0.0), e(1.0, 0.0)], 0, 0.5),
        "fb": record("full", [e(9.0, 2.0), e(4.0, 3.0), e(4.0, 3.0)], 3_000_000, 0.5),
    })
    flx_row = next(line for line in table.splitlines() if line.startswith("| flx"))
    assert "4.00x" in flx_row and "| 0 " in flx_row  # 4 s vs 1 s per epoch; eval bytes not counted
    fb_row = next(line for line in table.splitlines() if line.startswith("| fb"))
    assert "| 1 " in fb_row.replace("1.00x", "")  # 3 MB over 3 epochs = 1 MB/epoch


def test_compare_table_without_a_breakdown_shows_wall_time_and_recall():
    def vrd(wall_s, r50):
        return {"mode": None, "epochs": 2, "wall_s": wall_s, "epoch_breakdown": [], "ledger": {},
                "metrics": {"val_acc": 0.3, "val_R@50_k1": r50, "val_R@50_kall": 0.9, "val_zs_R@50_k1": 0.2}}

    table = compare_table({"vrd_ls": vrd(10.0, 0.75), "vrd_ls_svw": vrd(40.0, 0.77)})
    assert "wall s/epoch" in table.splitlines()[0] and "val R@50 k1" in table and "val zs R@50 k1" in table
    assert "comm" not in table  # nothing was booked: no zero columns pretending otherwise
    ls_row = next(line for line in table.splitlines() if line.startswith("| vrd_ls "))
    assert "| 5 " in ls_row and "4.00x" in ls_row and "0.75" in ls_row  # 10 s / 2 epochs; 20 s vs 5 s


def test_compare_runs_granndis_beside_fb_base(tmp_path):
    overrides = ["--trainer.max_epochs=2", "--trainer.devices=2", "--trainer.logger=false",
                 "--trainer.enable_progress_bar=false", "--data.init_args.name=synthetic-tiny",
                 f"--data.init_args.root={tmp_path / 'data'}", "--model.init_args.in_channels=32",
                 "--model.init_args.num_classes=8", "--trainer.check_val_every_n_epoch=1"]
    configs = [str(REPO / "recipes" / "granndis_eas.yaml"), str(REPO / "recipes" / "gnn_fb_base.yaml")]
    proc = run([GRANNDIS, "compare", *configs, *overrides], cwd=tmp_path, timeout=600)
    assert "== comparison" in proc.stdout and "speed-up vs gnn_fb_base" in proc.stdout
    assert "scaled down" in proc.stdout  # the links were scaled to this machine and say so
    eas = json.loads((tmp_path / "runs" / "compare" / "granndis_eas" / "summary.json").read_text())
    fb = json.loads((tmp_path / "runs" / "compare" / "gnn_fb_base" / "summary.json").read_text())
    assert eas["mode"] == "eas" and fb["mode"] == "full" and len(eas["epoch_breakdown"]) == 2
    assert eas["ledger"].get("inter/halo", {}).get("bytes", 0) == 0 and fb["ledger"]["inter/halo"]["bytes"] > 0
    assert 0.0 < eas["metrics"]["val_acc"] <= 1.0
    assert (tmp_path / "runs" / "compare" / "comparison.md").exists()
    # readable: each run in brief on the screen, its whole output in its log
    assert len(proc.stdout.splitlines()) < 60, proc.stdout
    assert "Seed set to 0" in (tmp_path / "runs" / "compare" / "granndis_eas" / "log.txt").read_text()


def test_run_digest_lists_each_warning_once_then_the_report_and_summary():
    from lightning_granndis.cli import run_digest

    warning = "/x/lib/_pytree.py:21: `isinstance(treespec, LeafSpec)` is deprecated"
    lines = ["Seed set to 0", warning, "Epoch 0: 100%|####| 1/1 [00:01<00:00]" + warning,
             "granndis: mode=auto chose eas: it fits", "granndis: building flx plan:  50%|##   | 1/2",
             "== fit summary ==", "epochs: 2   steps: 2", "wandb: sync later", "val_acc: 0.5"]
    assert run_digest(lines).splitlines() == ["warnings (1, each once):", f"  {warning}",
                                              "granndis: mode=auto chose eas: it fits", "== fit summary ==",
                                              "epochs: 2   steps: 2", "val_acc: 0.5"]


def test_compare_runs_the_optimus_cc_baseline_beside_cb(tmp_path):
    overrides = ["--trainer.max_steps=4", "--trainer.val_check_interval=4", "--trainer.limit_val_batches=2",
                 "--trainer.logger=false", "--trainer.enable_progress_bar=false", "--data.init_args.max_files=20",
                 "--model.init_args.hidden=32", "--model.init_args.layers=2", "--trainer.strategy.init_args.emulate=false"]
    configs = [str(REPO / "recipes" / "optimus_cc_baseline.yaml"), str(REPO / "recipes" / "optimus_cc_cb.yaml")]
    proc = run([GRANNDIS, "compare", *configs, *overrides], cwd=tmp_path, timeout=600)
    assert "val loss" in proc.stdout and "speed-up vs optimus_cc_cb" in proc.stdout
    base = json.loads((tmp_path / "runs" / "compare" / "optimus_cc_baseline" / "summary.json").read_text())
    cb = json.loads((tmp_path / "runs" / "compare" / "optimus_cc_cb" / "summary.json").read_text())
    assert base["steps"] == cb["steps"] == 4
    grad = lambda r: sum(v["bytes"] for k, v in r["ledger"].items() if k.endswith("/activation_grad"))  # noqa: E731
    assert 0 < grad(cb) < grad(base)
    assert abs(cb["metrics"]["val_loss"] - base["metrics"]["val_loss"]) < 0.05 * base["metrics"]["val_loss"]


def test_pipe_bd_recipes_train_the_teacher_then_compare_dna_with_pipe_bd(tmp_path):
    quick = ["--trainer.logger=false", "--trainer.enable_progress_bar=false", "--trainer.limit_train_batches=4",
             "--trainer.limit_val_batches=2", "--model.init_args.width_mult=0.25"]
    run([GRANNDIS, "fit", "--config", str(REPO / "recipes" / "pipe_bd_teacher.yaml"), "--trainer.max_epochs=1",
         *quick], cwd=tmp_path, timeout=600)
    assert (tmp_path / "runs" / "pipe_bd_teacher" / "teacher.pt").exists()
    configs = [str(REPO / "recipes" / "pipe_bd_dna.yaml"), str(REPO / "recipes" / "pipe_bd_auto.yaml")]
    proc = run([GRANNDIS, "compare", *configs, "--trainer.max_epochs=2", *quick], cwd=tmp_path, timeout=600)
    assert "val student acc" in proc.stdout and "speed-up vs pipe_bd_auto" in proc.stdout
    printed = proc.stdout + proc.stderr  # Lightning's rank-zero info goes to the log (stderr)
    assert "AHD schedule" in printed and "predicted" in printed and "measured" in printed
    dna = json.loads((tmp_path / "runs" / "compare" / "pipe_bd_dna" / "summary.json").read_text())
    auto = json.loads((tmp_path / "runs" / "compare" / "pipe_bd_auto" / "summary.json").read_text())
    assert dna["report"]["teacher_execs_per_batch"] == [21.0] * 4           # N(N+1)/2 with 6 blocks
    assert max(auto["report"]["teacher_execs_per_batch"]) < 6              # each block once per stage
    assert sum(auto["report"]["schedule"]["widths"]) == 4 and auto["report"]["predicted_step_s"] > 0
    relay = sum(v["bytes"] for k, v in auto["ledger"].items() if k.endswith("/teacher_relay"))
    assert (relay > 0) == (len(auto["report"]["schedule"]["stages"]) > 1)
    assert 0.0 <= auto["metrics"]["val_student_acc"] <= 1.0
