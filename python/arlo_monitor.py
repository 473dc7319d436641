"""arlo's monitors: a run's records, as the live page draws them, into Weights & Biases or TensorBoard.

`arlo run` starts one of these per entry of `monitors.use` (its own process, under the project's
Python environment) and restarts it when it dies; a monitor never holds up the run:

    python arlo_monitor.py --kind wandb|tensorboard --run-dir RUN_DIR --options '{"project": ...}'

It follows the run's record stream, `<run dir>/metrics.jsonl` (and for W&B's table of samples
`<run dir>/rollouts.jsonl`), which the run appends to whatever the monitor does: the file is the bounded-by-disk queue between the two, so a monitor that is slow, dead
or restarting drops nothing, and catches up from where it was. Where it was (the byte offset of the
next record, and the W&B run id) is kept in `<run dir>/monitors/<kind>.json`, written after every
batch the sink has flushed: a restarted monitor, or a resumed run, continues the same W&B run and
the same TensorBoard log without logging a step twice (TensorBoard is also told to purge anything a
killed monitor wrote past that point). On SIGTERM (the run's end) it logs the rest, the run's
summary.json when there is one, and finishes.

Records, by kind (docs/architecture.md names the keys): every number of a `step` record at its step,
`off_policy/histogram` as a histogram, `eval` records at their version, `weight_sync` records at
their step with each worker's pause, update and resume seconds; `pipeline` records (the console's
view, not drawn on the page) are left out. W&B also gets the resolved config, the run's summary at
the end, and a table `rollouts` of the newest sampled rollouts (prompt, completion or a multi-turn
trajectory's turns, reward, version), logged again as new ones come (at most every TABLE_EVERY_S
seconds, and at the end).
"""

import argparse
import json
import math
import os
import secrets
import signal
import sys
import time

POLL_S = 0.5  # how often the record stream is looked at when nothing new was there
TABLE_ROWS = 500  # the W&B rollouts table: the newest this many samples
TABLE_EVERY_S = 30.0


def log(msg):
    print(f"arlo-monitor: {msg}", flush=True)


def worker_label(worker):
    """A worker URL as a metric name part: http://127.0.0.1:8000 -> 127.0.0.1:8000."""
    return worker.split("://", 1)[-1].rstrip("/").replace("/", "_")


def scalars(rec):
    """The (name, value) pairs of one record that a monitor logs, and the step they belong to."""
    kind = rec.get("kind", "step")
    step = rec.get("step")
    if not isinstance(step, int) or kind == "pipeline":
        return None, []
    out = []
    for k, v in rec.items():
        if "/" not in k:  # step, time, kind, version, applied: what a record is, not a figure
            continue
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out.append((k, float(v)))
    if kind == "weight_sync":
        for w in rec.get("workers", []):
            label = worker_label(str(w.get("worker", "?")))
            for part in ("pause_s", "update_s", "resume_s"):
                if isinstance(w.get(part), (int, float)):
                    out.append((f"weight_sync/worker/{label}/{part}", float(w[part])))
    return step, out


def histogram(rec):
    """`off_policy/histogram`: the count of samples d versions behind, for d = 0, 1, ...; or None."""
    counts = rec.get("off_policy/histogram")
    if not isinstance(counts, list) or not any(counts) or not all(isinstance(c, (int, float)) for c in counts):
        return None
    return [float(c) for c in counts]


class TensorBoard:
    """Event files under options['dir'], written with TensorBoard's own event-file writer (whose
    flush() returns once every event before it is on disk: the saved offset never runs ahead)."""

    def __init__(self, options, state, purge_step):
        from tensorboard.compat.proto import event_pb2, summary_pb2
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self.pb, self.summary_pb = event_pb2, summary_pb2
        self.dir = options["dir"]
        os.makedirs(self.dir, exist_ok=True)
        self.writer = EventFileWriter(self.dir)
        if purge_step is not None:
            # TensorBoard's reader hides every earlier event at or past a restart's step
            # (restart_point): what a killed monitor wrote past its saved offset.
            self.writer.add_event(self.pb.Event(step=purge_step, wall_time=time.time(),
                                                session_log=self.pb.SessionLog(status=self.pb.SessionLog.START)))
        log(f"tensorboard: writing to {self.dir}")

    def event(self, step, walltime, values):
        self.writer.add_event(self.pb.Event(step=step, wall_time=walltime or time.time(),
                                            summary=self.summary_pb.Summary(value=values)))

    def record(self, rec):
        step, values = scalars(rec)
        if step is None:
            return step
        # One event per record, the tags as the names are (TensorBoard takes any tag).
        Value = self.summary_pb.Summary.Value
        self.event(step, rec.get("time"), [Value(tag=name, simple_value=v) for name, v in values])
        counts = histogram(rec)
        if counts is not None:  # one bucket per distance d: (d - 0.5, d + 0.5]
            used = [d for d, c in enumerate(counts) if c > 0]
            h = self.summary_pb.HistogramProto(
                min=used[0], max=used[-1], num=sum(counts), sum=sum(d * c for d, c in enumerate(counts)),
                sum_squares=sum(d * d * c for d, c in enumerate(counts)),
                bucket_limit=[d + 0.5 for d in range(len(counts))], bucket=counts)
            self.event(step, rec.get("time"), [Value(tag="off_policy/histogram", histo=h)])
        return step

    def flush(self):
        self.writer.flush()

    def finish(self, summary):  # the summary goes to W&B; TensorBoard has no place for it
        self.writer.close()


class Wandb:
    """One W&B run per arlo run (resumed with its id), written by the official wandb client."""

    def __init__(self, options, state, purge_step):
        import wandb

        self.wandb = wandb
        config = None
        cfg_path = options.get("config_path")
        if cfg_path and os.path.exists(cfg_path):
            import yaml

            with open(cfg_path) as f:
                config = redact(yaml.safe_load(f))
        run_id = state.get("wandb_run_id") or secrets.token_hex(4)  # W&B ids: 8 of [a-z0-9]
        state["wandb_run_id"] = run_id
        self.run = wandb.init(
            project=options.get("project") or None, entity=options.get("entity") or None,
            name=options.get("name") or None, tags=options.get("tags") or None,
            mode=options.get("mode", "online"), dir=options.get("dir") or None, config=config,
            id=run_id, resume="allow")
        # Eval records come after later steps (the eval of version v ends while steps v+1.. train),
        # so every figure is plotted against arlo's step rather than W&B's own row counter.
        self.run.define_metric("arlo/step")
        self.run.define_metric("*", step_metric="arlo/step")
        self.table_rows, self.table_step, self.table_at, self.table_new = [], 0, 0.0, False
        log(f"wandb: run {run_id} ({options.get('mode', 'online')}) in project {options.get('project')}"
            + (f": {self.run.url}" if getattr(self.run, "url", None) else ""))

    def rollout(self, rec):
        """One rollouts.jsonl group: its samples become the newest rows of the table."""
        for s in rec.get("samples", []):
            versions = s.get("versions") or [[rec.get("dispatch_version"), 0]]
            # A multi-turn trajectory: its turns, "role: text" each, in place of the last model turn.
            turns = "\n".join(f"{t.get('role')}: {t.get('content')}" for t in s.get("turns") or [])
            self.table_rows.append([rec.get("step"), versions[-1][0], rec.get("prompt", ""),
                                    turns or s.get("completion", ""), s.get("reward"), rec.get("answer", ""),
                                    rec.get("worker", "")])
        del self.table_rows[:-TABLE_ROWS]
        self.table_step = max(self.table_step, rec.get("step") or 0)
        self.table_new = True

    def log_table(self, force=False):
        if not self.table_new or (not force and time.monotonic() - self.table_at < TABLE_EVERY_S):
            return
        table = self.wandb.Table(columns=["step", "version", "prompt", "completion", "reward", "answer", "worker"],
                                 data=self.table_rows)
        self.run.log({"arlo/step": self.table_step, "rollouts": table})
        self.table_at, self.table_new = time.monotonic(), False

    def record(self, rec):
        step, values = scalars(rec)
        if step is None:
            return step
        data = {"arlo/step": step}
        data.update(values)
        counts = histogram(rec)
        if counts is not None:  # bins [d, d + 1)
            data["off_policy/histogram"] = self.wandb.Histogram(np_histogram=(counts, list(range(len(counts) + 1))))
        self.run.log(data)
        return step

    def flush(self):
        self.log_table()  # the client writes every log call through to its run file

    def finish(self, summary):
        self.log_table(force=True)
        if summary is not None:
            for k, v in flatten(summary, "summary/").items():  # the run's summary.json, beside the last values
                self.run.summary[k] = v
        self.run.finish()


SINKS = {"wandb": Wandb, "tensorboard": TensorBoard}

SECRET_WORDS = ("token", "secret", "password", "api_key", "apikey")


def redact(value, key=""):
    """The config as W&B may keep it: any non-empty string under a key that names a secret
    (security.token, a reward module's api_key, ...) becomes "<redacted>"."""
    if isinstance(value, dict):
        return {k: redact(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact(v, key) for v in value]
    if isinstance(value, str) and value and any(w in key.lower() for w in SECRET_WORDS) and not key.endswith("_file"):
        return "<redacted>"
    return value


def flatten(d, prefix=""):
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        elif isinstance(v, (int, float, str, bool)):
            out[key] = v
    return out


class State:
    """<run dir>/monitors/<kind>.json: the offset of the next record and the sink's own ids."""

    def __init__(self, run_dir, kind):
        self.path = os.path.join(run_dir, "monitors", f"{kind}.json")
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        try:
            with open(self.path) as f:
                self.data = json.load(f)
        except FileNotFoundError:
            self.data = {}
        except (OSError, ValueError) as e:
            log(f"{self.path}: unreadable ({e}); starting from the first record")
            self.data = {}
        self.data.setdefault("offset", 0)

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)


class Stream:
    """The complete lines of metrics.jsonl from an offset on (a partial last line waits)."""

    def __init__(self, path, offset):
        self.path, self.offset, self.f = path, offset, None

    def read(self):
        if self.f is None:
            try:
                self.f = open(self.path, "rb")
            except FileNotFoundError:
                return []
            self.f.seek(self.offset)
        chunk = self.f.read()
        self.f.seek(self.offset)
        end = chunk.rfind(b"\n")
        if end < 0:
            return []
        lines = []
        for raw in chunk[: end + 1].splitlines(keepends=True):
            self.offset += len(raw)
            lines.append((raw, self.offset))
        self.f.seek(self.offset)
        return lines


def parse(lines, path):
    """The JSON objects of (raw line, end offset) pairs; a line that is not one is said and skipped."""
    for raw, end in lines:
        try:
            rec = json.loads(raw)
        except ValueError as e:
            log(f"{path}: the line at byte {end - len(raw)} is not JSON ({e}); skipped")
            continue
        if isinstance(rec, dict):
            yield rec


def restart_point(path, offset):
    """Where a restarted monitor's TensorBoard log picks up. A killed monitor may have written records
    past its saved `offset`; TensorBoard hides every event at or past a restarted writer's purge step,
    and steps are not in file order (an eval record comes after later steps), so the purge step is the
    lowest step of the records past `offset`, and the records before `offset` at or past it are written
    again. Returns (purge step or None, those records)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, []
    end = data.rfind(b"\n") + 1

    def records(chunk, start):
        lines, pos = [], start
        for raw in chunk.splitlines(keepends=True):
            pos += len(raw)
            lines.append((raw, pos))
        return [r for r in parse(lines, path) if isinstance(r.get("step"), int)]

    after = [r["step"] for r in records(data[offset:end], offset)]
    if not after:
        return None, []
    purge = min(after)
    return purge, [r for r in records(data[:offset], 0) if r["step"] >= purge]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kind", required=True, choices=sorted(SINKS))
    ap.add_argument("--run-dir", required=True)
    ap.add_argument("--options", default="{}", help="the monitor's settings as JSON")
    args = ap.parse_args(argv)
    options = json.loads(args.options)

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(True))

    metrics = os.path.join(args.run_dir, "metrics.jsonl")
    state = State(args.run_dir, args.kind)
    resumed = state.data["offset"] > 0
    purge_step, replay = restart_point(metrics, state.data["offset"]) if resumed else (None, [])
    sink = SINKS[args.kind](options, state.data, purge_step)
    if isinstance(sink, TensorBoard):
        for rec in replay:
            sink.record(rec)
    state.save()
    stream = Stream(metrics, state.data["offset"])
    samples = Stream(os.path.join(args.run_dir, "rollouts.jsonl"), state.data.setdefault("rollouts_offset", 0))
    wants_samples = hasattr(sink, "rollout")
    if resumed:
        log(f"continuing at byte {state.data['offset']} of {metrics}"
            + (f" (tensorboard: from step {purge_step}, {len(replay)} records again)" if purge_step is not None else ""))
    logged = 0
    while True:
        last_pass = bool(stopping)  # after SIGTERM: one more pass takes what the run wrote last
        lines = stream.read()
        for rec in parse(lines, metrics):
            if sink.record(rec) is not None:
                logged += 1
        sample_lines = samples.read() if wants_samples else []
        for rec in parse(sample_lines, samples.path):
            sink.rollout(rec)
        if lines or sample_lines:
            sink.flush()
            state.data["offset"], state.data["rollouts_offset"] = stream.offset, samples.offset
            state.save()
        if last_pass:
            break
        if not lines:
            time.sleep(POLL_S)
    summary = None
    try:
        with open(os.path.join(args.run_dir, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        pass
    sink.finish(summary)
    log(f"{args.kind}: finished: {logged} records logged this time")
    return 0


if __name__ == "__main__":
    sys.exit(main())
