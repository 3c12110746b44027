"""Fault injection: at least 100 faults across the four strategy families, each run under
``torchrun --max-restarts`` and resumed by itself (``ResumableCheckpoint``, ``ckpt_path="last"``).

Families (small models, 4 ranks = 2 virtual servers x 2 devices, gloo), each a user's script that
validates every epoch under a best-2 monitor: ``ddp`` (server_aware_ddp, an MLP with BatchNorm and
dropout, Adam + OneCycle per step, accumulation 2, a shuffled loader with 2 workers), ``gnn``
(granndis CoB, a user's PyG GCN with BatchNorm and dropout, co-batches drawn every epoch),
``pipeline`` (compressed_pipeline, GPT with dropout, 2 stages x 2 replicas, compressed backward
with error feedback, 2 loader workers), ``pipe_bd`` (shuffled, 2 workers). Every launch injects one fault per attempt (a plan drawn from a seed), so
one launch of ``n`` faults restarts ``n`` times; ``tests/scripts/fault_train.py`` is the worker.

Fault kinds: ``kill`` (SIGKILL of a random rank at a random step), ``write`` (rank 0 killed
between writing its checkpoint file and committing the set), ``corrupt`` (the newest committed
checkpoint truncated, then a kill: resume must skip it), ``stop`` (SIGSTOP: a hung rank; the
peers' collectives time out after 8 s), ``replica`` / ``replica_lost`` (a kill with a
ReplicaSnapshot every step; ``_lost``: the killed rank's server loses its snapshots too), ``val``
(a kill inside the first validation batch after a step), ``prefetch`` (a rank killed from inside its
DataLoader worker's next read: a kill during prefetch).

Per family and kind: faults injected, runs completed, steps lost (mean, max), recovery seconds
(the kill to the first step of the next attempt; includes torchrun's restart and the job's set-up),
final parameters and validation history equal to the uninterrupted run's, for replica recovery the
steps the disk checkpoint alone would have lost, and for hangs the peers that named the stopped
rank and how long after the stop the last of them did. Disk checkpoints every 4 steps (every 8 with snapshots).

    python benchmarks/faults.py [--seed 0]

Writes benchmarks/results/faults.{json,md,png} with top-level ``injected``, ``survived``,
``corrupted_loads``, ``max_steps_lost_checkpoint``, ``max_steps_lost_replica``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from _results import save_results  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORKER = REPO / "tests" / "scripts" / "fault_train.py"
STEPS, EVERY, EVERY_WITH_SNAPSHOTS = 40, 4, 8
HANG_TIMEOUT_S = 8  # the ddp family's collective timeout when its plan stops a rank (fault_train.py)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def increasing_steps(rng: random.Random, n: int, start: int = 0, gap: tuple[int, int] = (1, 4)) -> list[int]:
    steps, step = [], start
    for _ in range(n):
        step += rng.randint(*gap)
        steps.append(step)
    return steps


def plans(rng: random.Random) -> list[dict]:
    """Every launch: family, name, fault plan, snapshots on or off."""
    launches = []
    for family in ("ddp", "gnn", "pipeline", "pipe_bd"):
        launches.append({"family": family, "name": "uninterrupted", "plan": [], "snapshots": False})
        launches.append({"family": family, "name": "kill", "snapshots": False, "plan": [
            {"kind": "kill", "step": s, "rank": rng.randrange(4)} for s in increasing_steps(rng, 6, gap=(2, 5))]})
        # write at a checkpoint step, then corrupt at a later step, alternately
        plan, step = [], 0
        for i in range(8):
            if i % 2 == 0:
                step = (step // EVERY + 1) * EVERY
                plan.append({"kind": "write", "step": step, "rank": 0})
            else:
                step += rng.randint(1, 3)
                plan.append({"kind": "corrupt", "step": step, "rank": rng.randrange(4)})
        launches.append({"family": family, "name": "write_corrupt", "snapshots": False, "plan": plan})
        # kills during a validation, and (families with loader workers) inside a worker's prefetch
        # (the gnn family has no DataLoader workers: its co-batches come from the strategy's sampler)
        kinds = ["val", "prefetch"] * 3 if family != "gnn" else ["val"] * 6
        launches.append({"family": family, "name": "val_prefetch", "snapshots": False, "plan": [
            {"kind": k, "step": s, "rank": rng.randrange(4)}
            for k, s in zip(kinds, increasing_steps(rng, len(kinds), gap=(2, 5)))]})
        if family != "pipeline":  # a pipeline's servers hold no whole replica (ReplicaSnapshot refuses it)
            kinds = ["replica", "replica_lost"] * 4 if family == "ddp" else ["replica"] * 8
            launches.append({"family": family, "name": "replica", "snapshots": True, "plan": [
                {"kind": k, "step": s, "rank": rng.randrange(4)}
                for k, s in zip(kinds, increasing_steps(rng, 8, gap=(1, 4)))]})
    launches.append({"family": "ddp", "name": "hang", "snapshots": False, "plan": [
        {"kind": "stop", "step": s, "rank": rng.randrange(4)} for s in increasing_steps(rng, 4, gap=(2, 6))]})
    return launches


def run(launch: dict, out: Path) -> dict:
    env = dict(os.environ, FAULT_PLAN=json.dumps(launch["plan"]), FAULT_STEPS=str(STEPS),
               FAULT_EVERY=str(EVERY_WITH_SNAPSHOTS if launch["snapshots"] else EVERY),
               FAULT_SNAPSHOTS="1" if launch["snapshots"] else "0", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=4",
           f"--max-restarts={len(launch['plan'])}", "--monitor-interval=0.5", "--master-addr=127.0.0.1",
           f"--master-port={free_port()}", str(WORKER), launch["family"], str(out)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO, timeout=1800)
    seconds = time.perf_counter() - t0
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()] \
        if (out / "events.jsonl").exists() else []
    return {"rc": proc.returncode, "seconds": seconds, "events": events,
            "stderr_tail": proc.stderr[-2000:] if proc.returncode else ""}


def finals(out: Path, family: str) -> list[dict]:
    if family == "pipeline":
        return [torch.load(out / f"final.{r}.pt") for r in range(4)]
    return [torch.load(out / "final.pt")]


def equal(a: list[dict], b: list[dict]) -> bool:
    return all(x.keys() == y.keys() and all(torch.allclose(x[k].float(), y[k].float(), atol=1e-6) for k in x)
               for x, y in zip(a, b))


def history(out: Path) -> dict:
    return json.loads((out / "history.json").read_text())


def same_history(a: dict, b: dict) -> bool:
    """The same validations (step, epoch) with the same metrics, and the same best-k scores."""
    if [(r["step"], r["epoch"]) for r in a["validations"]] != [(r["step"], r["epoch"]) for r in b["validations"]]:
        return False
    close = lambda x, y: abs(x - y) <= 1e-6  # noqa: E731
    return (all(close(x[m], y.get(m, float("nan"))) for x, y in zip(a["validations"], b["validations"]) for m in x
                if m.startswith("val_"))
            and len(a["best_k"]) == len(b["best_k"]) and all(map(close, a["best_k"], b["best_k"])))


def faults_of(launch: dict, result: dict) -> list[dict]:
    """One row per injected fault: steps lost, recovery seconds, corrupted load."""
    firsts = {e["attempt"]: e for e in result["events"] if e["event"] == "first_step"}
    hits = {e["attempt"]: e for e in result["events"] if e["event"] == "fault"}
    corrupted = {e["attempt"]: e["path"] for e in result["events"] if e["event"] == "corrupted"}
    rows = []
    for attempt, fault in enumerate(launch["plan"]):
        hit, nxt = hits.get(attempt), firsts.get(attempt + 1)
        row = {"kind": fault["kind"], "step": fault["step"], "injected": hit is not None,
               "recovered": hit is not None and nxt is not None}
        if row["recovered"]:
            row["steps_lost"] = hit["step"] - nxt["resumed_step"]  # (hit: the steps done when the rank died)
            row["recovery_s"] = nxt["time"] - hit["time"]
            row["resumed_from"] = nxt["resumed_from"]
            row["corrupted_load"] = attempt in corrupted and nxt["resumed_from"] == corrupted[attempt]
            if fault["kind"] == "stop":  # each live peer names the stopped rank, this long after the stop
                failed = [e for e in result["events"] if e["event"] == "failed" and e["attempt"] == attempt
                          and e["rank"] != fault["rank"]]
                named = [e for e in failed if f"rank {fault['rank']} of 4 stopped answering" in e["message"]]
                row["named_by_peers"] = len(named)
                row["named_within_s"] = max((e["time"] for e in named), default=float("nan")) - hit["time"]
            if fault["kind"].startswith("replica"):  # what the disk checkpoint alone would have lost
                row["steps_lost_checkpoint_only"] = fault["step"] - (fault["step"] // EVERY_WITH_SNAPSHOTS) * \
                    EVERY_WITH_SNAPSHOTS
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", nargs="*", default=None, metavar="FAMILY/NAME",
                        help="a quick check: only these launches (each family's uninterrupted one too); "
                             "the report then goes to a temporary folder, not benchmarks/results")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    launches = plans(rng)
    if args.only:
        keep = set(args.only)
        launches = [x for x in launches if f"{x['family']}/{x['name']}" in keep or
                    (x["name"] == "uninterrupted" and any(k.split("/")[0] == x["family"] for k in keep))]
    total = sum(len(launch["plan"]) for launch in launches)
    print(f"faults: {total} in {len(launches)} launches", flush=True)
    references, rows = {}, []
    with tempfile.TemporaryDirectory(prefix="faults_") as tmp:
        for i, launch in enumerate(launches):
            out = Path(tmp) / f"{launch['family']}_{launch['name']}"
            result = run(launch, out)
            finished = result["rc"] == 0 and any(e["event"] == "finished" for e in result["events"])
            same = None
            same_val = None
            if finished and launch["name"] == "uninterrupted":
                references[launch["family"]] = (finals(out, launch["family"]), history(out))
            elif finished:
                same = equal(finals(out, launch["family"]), references[launch["family"]][0])
                same_val = same_history(history(out), references[launch["family"]][1])
            faults = faults_of(launch, result)
            for row in faults:
                row.update(family=launch["family"], launch=launch["name"], run_completed=finished,
                           final_equal=same, history_equal=same_val)
            rows += faults
            print(f"[{i + 1}/{len(launches)}] {launch['family']:8s} {launch['name']:14s} faults "
                  f"{len(faults):2d}  completed {finished}  equal {same}  validations equal {same_val}  "
                  f"{result['seconds']:.0f}s", flush=True)
            if result["rc"]:
                print(result["stderr_tail"], flush=True)
    report(rows, args.seed, Path(tempfile.mkdtemp(prefix="faults_check_")) if args.only else None)


def summary(rows: list[dict]) -> dict:
    lost = [r["steps_lost"] for r in rows if r.get("recovered")]
    rec = [r["recovery_s"] for r in rows if r.get("recovered")]
    out = {"injected": sum(r["injected"] for r in rows), "recovered": sum(r["recovered"] for r in rows),
           "runs_completed": all(r["run_completed"] for r in rows),
           "final_equal": all(r["final_equal"] for r in rows),
           "history_equal": all(r["history_equal"] for r in rows),
           "steps_lost_mean": statistics.mean(lost) if lost else None, "steps_lost_max": max(lost, default=None),
           "recovery_s_mean": statistics.mean(rec) if rec else None, "recovery_s_max": max(rec, default=None),
           "corrupted_loads": sum(bool(r.get("corrupted_load")) for r in rows)}
    only = [r["steps_lost_checkpoint_only"] for r in rows if "steps_lost_checkpoint_only" in r]
    if only:
        out["checkpoint_only_steps_lost_mean"], out["checkpoint_only_steps_lost_max"] = statistics.mean(only), max(only)
    return out


def report(rows: list[dict], seed: int, folder: Path | None = None) -> None:
    groups: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        groups.setdefault((row["family"], row["kind"]), []).append(row)
    table = {f"{f}/{k}": summary(g) for (f, k), g in sorted(groups.items())}
    replica = [r for r in rows if r["kind"].startswith("replica")]
    checkpoint = [r for r in rows if not r["kind"].startswith("replica")]
    stops = [r for r in rows if r["kind"] == "stop" and r.get("recovered")]
    hangs = {"stopped": len(stops), "named_by_all_3_peers": sum(r.get("named_by_peers") == 3 for r in stops),
             "named_within_s_max": max((r["named_within_s"] for r in stops), default=None),
             "target_s": HANG_TIMEOUT_S + 10}
    survived = sum(r["recovered"] and r["run_completed"] and bool(r["final_equal"]) and bool(r["history_equal"])
                   for r in rows)
    data = {
        "injected": sum(r["injected"] for r in rows),
        "survived": survived,
        "corrupted_loads": sum(bool(r.get("corrupted_load")) for r in rows),
        "max_steps_lost_checkpoint": max((r["steps_lost"] for r in checkpoint if r.get("recovered")), default=None),
        "max_steps_lost_replica": max((r["steps_lost"] for r in replica if r.get("recovered")), default=None),
        "hangs": hangs,
        "by_family_and_kind": table,
        "faults": rows,
        "meta": {"seed": seed, "steps": STEPS, "checkpoint_every": EVERY,
                 "checkpoint_every_with_snapshots": EVERY_WITH_SNAPSHOTS, "ranks": 4, "servers": 2,
                 "command": "python benchmarks/faults.py", "machine": f"{os.cpu_count()} cores, CPU, gloo"},
    }
    lines = ["# Fault injection", "",
             f"{data['injected']} faults injected, {survived} survived (the run finished after restarting and ended "
             f"with the uninterrupted run's parameters and validation history: every validation's metrics and the "
             f"best-2 checkpoints' scores), {data['corrupted_loads']} corrupted loads. Steps lost: at most "
             f"{data['max_steps_lost_checkpoint']} with disk checkpoints every {EVERY} steps, at most "
             f"{data['max_steps_lost_replica']} with replica snapshots every step.", "",
             "| family / kind | injected | recovered | runs completed | final = uninterrupted | validations = uninterrupted "
             "| steps lost mean | max | disk-only would lose (mean / max) | recovery s mean | max | corrupted loads |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    if stops:
        lines[4:4] = [f"Hangs: {hangs['named_by_all_3_peers']} of {hangs['stopped']} stopped ranks named by all 3 "
                      f"live peers, the last of them {hangs['named_within_s_max']:.1f} s after the stop (target: "
                      f"within the {HANG_TIMEOUT_S} s collective timeout + 10 s).", ""]
    for key, s in table.items():
        only = (f"{s['checkpoint_only_steps_lost_mean']:.1f} / {s['checkpoint_only_steps_lost_max']}"
                if "checkpoint_only_steps_lost_mean" in s else "")
        fmt = lambda v, p=1: "" if v is None else f"{v:.{p}f}"  # noqa: E731
        lines.append(f"| {key} | {s['injected']} | {s['recovered']} | {s['runs_completed']} | {s['final_equal']} | "
                     f"{s['history_equal']} | "
                     f"{fmt(s['steps_lost_mean'])} | {s['steps_lost_max']} | {only} | {fmt(s['recovery_s_mean'])} | "
                     f"{fmt(s['recovery_s_max'])} | {s['corrupted_loads']} |")
    lines += ["", "Recovery seconds run from the kill to the next attempt's first step: torchrun's restart, "
              "the job's set-up (imports, process group, checkpoint load) and one step, on 2 shared cores. "
              "A hang adds the 8 s collective timeout and torchrun's 30 s grace before it SIGKILLs the stopped "
              "rank.", "", f"`python benchmarks/faults.py --seed {seed}`", ""]

    def plot(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        keys = list(table)
        fig, (a, b) = plt.subplots(1, 2, figsize=(13, 4.5))
        a.bar(keys, [table[k]["steps_lost_mean"] or 0 for k in keys], color="tab:blue", label="mean")
        a.scatter(keys, [table[k]["steps_lost_max"] or 0 for k in keys], color="tab:red", zorder=3, label="max")
        a.set_ylabel("steps lost per fault")
        a.legend()
        b.bar(keys, [table[k]["recovery_s_mean"] or 0 for k in keys], color="tab:green")
        b.set_ylabel("recovery seconds (kill to next step)")
        for ax in (a, b):
            ax.tick_params(axis="x", rotation=70)
        fig.suptitle(f"{data['injected']} faults, {survived} survived, {data['corrupted_loads']} corrupted loads")
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)

    save_results("faults", data, "\n".join(lines), plot, folder)


if __name__ == "__main__":
    main()
