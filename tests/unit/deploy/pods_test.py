#!/usr/bin/python3
"""The Kubernetes manifests' pods, run as they are written, on simulated hosts.

Each pod of deploy/kubernetes (the StatefulSet's replicas, the two Jobs) becomes a network namespace
on one bridge with its own address, where its container's command runs with its env, as root
instead of uid 1000. Kubernetes' part is done here:

- DNS: each pod's /etc/hosts (bind-mounted in a private mount namespace) maps every Service name
  to its pod, and a headless Service's per-pod names (arlo-worker-0.arlo-worker) to each replica; a
  ClusterIP Service resolves to the one pod it selects;
- volumes: the ConfigMap's files (kustomization.yaml's configMapGenerator), a fresh token for the
  Secret, a directory per claim; since /etc/arlo does not exist here, each mountPath is replaced by
  its directory in the commands and in the mounted config files (the only edit besides the length);
- $(VAR) expansion: `$$` becomes `$` (check.py has checked nothing else needs expanding);
- the run is shortened to a few steps: run.max_steps, sft_warmup_steps, eval.interval in arlo.yaml
  and the trainer's --max-steps, edited together.

Then the orchestrator's Job must end with exit status 0, every step trained, the trainer's Job too,
and every worker must hold the trainer's final weights (summary.json's checksums).

    pods_test.py <source dir> <dir of arlo> <dir of arlo-worker> <dir of arlo-trainer> [star|chain]

`chain` applies the edits deploy/kubernetes/README.md gives for weight_sync.topology chain (each
worker relays to the next on relay_port + k of its DNS name) and checks the same outcome.

Exit status 77 (ctest: skipped) with the reason when network namespaces cannot be made here (not
root, no `ip`/`unshare`).
"""
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import yaml

STEPS = 12
SKIP = 77


def fail(message):
    print(f"pods_test: FAILED: {message}", flush=True)
    sys.exit(1)


def skip(message):
    print(f"pods_test: SKIPPED: {message}", flush=True)
    sys.exit(SKIP)


def sh(*argv, check=True):
    p = subprocess.run(argv, capture_output=True, text=True)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: exit {p.returncode}: {p.stderr.strip()}")
    return p


def load(k8s_dir):
    docs = []
    for name in sorted(os.listdir(k8s_dir)):
        if name.endswith(".yaml") and name != "kustomization.yaml":
            with open(os.path.join(k8s_dir, name), encoding="utf-8") as fh:
                docs += [d for d in yaml.safe_load_all(fh) if d]
    with open(os.path.join(k8s_dir, "kustomization.yaml"), encoding="utf-8") as fh:
        kustomization = yaml.safe_load(fh)
    return docs, kustomization


def replace_once(text, old, new, where):
    if old not in text:
        fail(f"{where} no longer holds {old!r}: update this test")
    return text.replace(old, new)


class Pod:
    def __init__(self, name, labels, spec, workload):
        self.name = name
        self.labels = labels
        self.spec = spec
        self.workload = workload
        self.ip = None
        self.netns = None
        self.proc = None
        self.log = None


def pods_of(docs):
    pods = []
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind not in ("StatefulSet", "Job"):
            continue
        tmpl = d["spec"]["template"]
        labels = tmpl["metadata"]["labels"]
        replicas = d["spec"].get("replicas", 1) if kind == "StatefulSet" else 1
        for i in range(replicas):
            pods.append(Pod(f"{name}-{i}" if kind == "StatefulSet" else name, labels, tmpl["spec"], d))
    return pods


def main(argv):
    if len(argv) not in (5, 6) or (len(argv) == 6 and argv[5] not in ("star", "chain")):
        print(__doc__)
        return 2
    source, bin_dirs = argv[1], [os.path.abspath(d) for d in argv[2:5]]
    topology = argv[5] if len(argv) == 6 else "star"
    if os.geteuid() != 0:
        skip("needs root (network namespaces, mounts)")
    for tool in ("ip", "unshare", "mount"):
        if not shutil.which(tool):
            skip(f"`{tool}` is not installed (iproute2, util-linux)")
    k8s_dir = os.path.join(source, "deploy", "kubernetes")
    docs, kustomization = load(k8s_dir)
    pods = pods_of(docs)
    by_name = {p.name: p for p in pods}
    for required in ("arlo-orchestrator", "arlo-trainer", "arlo-worker-0"):
        if required not in by_name:
            fail(f"no pod {required} in the manifests")

    work = tempfile.mkdtemp(prefix="arlo-k8s-pods-")
    tag = f"ak{os.getpid() % 100000}"
    bridge = f"{tag}br"
    made_netns, made_links = [], []
    try:
        # The cluster network: one bridge, one namespace per pod. No address in the root namespace.
        try:
            sh("ip", "link", "add", bridge, "type", "bridge")
        except RuntimeError as e:
            skip(f"cannot make a bridge here: {e}")
        made_links.append(bridge)
        sh("ip", "link", "set", bridge, "up")
        subnet = 64 + os.getpid() % 128
        for i, p in enumerate(pods):
            p.netns = f"{tag}-{p.name}"
            p.ip = f"10.{subnet}.7.{i + 2}"
            host_end, pod_end = f"{tag}v{i}", f"{tag}p{i}"
            sh("ip", "netns", "add", p.netns)
            made_netns.append(p.netns)
            sh("ip", "link", "add", host_end, "type", "veth", "peer", "name", pod_end)
            made_links.append(host_end)
            sh("ip", "link", "set", pod_end, "netns", p.netns)
            sh("ip", "link", "set", host_end, "master", bridge, "up")
            sh("ip", "-n", p.netns, "link", "set", "lo", "up")
            sh("ip", "-n", p.netns, "link", "set", pod_end, "name", "eth0")
            sh("ip", "-n", p.netns, "addr", "add", f"{p.ip}/24", "dev", "eth0")
            sh("ip", "-n", p.netns, "link", "set", "eth0", "up")

        # DNS: Services to pods.
        names = {}
        for d in docs:
            if d["kind"] != "Service":
                continue
            svc, spec = d["metadata"]["name"], d["spec"]
            selected = [p for p in pods if all(p.labels.get(k) == v for k, v in spec["selector"].items())]
            if spec.get("clusterIP") == "None":
                for p in selected:
                    if p.workload["kind"] == "StatefulSet" and p.workload["spec"]["serviceName"] == svc:
                        names[f"{p.name}.{svc}"] = p.ip
            elif len(selected) == 1:
                names[svc] = selected[0].ip
            else:
                fail(f"Service {svc} selects {len(selected)} pods; this test simulates a ClusterIP by its one pod")
        hosts = os.path.join(work, "hosts")
        with open(hosts, "w") as fh:
            fh.write("127.0.0.1 localhost\n")
            for n, ip in names.items():
                fh.write(f"{ip} {n}\n")

        # Volumes.
        generated = {}
        for g in kustomization.get("configMapGenerator") or []:
            files = {}
            for f in g["files"]:
                key, _, path = f.partition("=") if "=" in f else (os.path.basename(f), "", f)
                with open(os.path.join(k8s_dir, path), encoding="utf-8") as fh:
                    files[key] = fh.read()
            generated[("configMap", g["name"])] = files
        token = secrets.token_hex(32)
        for g in kustomization.get("secretGenerator") or []:
            generated[("secret", g["name"])] = {os.path.basename(f.partition("=")[0] if "=" in f else f): token + "\n"
                                                for f in g["files"]}
        arlo_yaml = generated[("configMap", "arlo-config")]["arlo.yaml"]
        arlo_yaml = replace_once(arlo_yaml, "max_steps: 1285", f"max_steps: {STEPS}", "config/arlo.yaml")
        arlo_yaml = replace_once(arlo_yaml, "sft_warmup_steps: 285", "sft_warmup_steps: 4", "config/arlo.yaml")
        arlo_yaml = replace_once(arlo_yaml, "interval: 50\n  k: 1", "interval: 0\n  k: 1", "config/arlo.yaml")
        generated[("configMap", "arlo-config")]["arlo.yaml"] = arlo_yaml
        if topology == "chain":  # the edits deploy/kubernetes/README.md gives for a chain
            workers = [p.name for p in pods if p.workload["kind"] == "StatefulSet"]
            arlo_yaml = replace_once(arlo_yaml, "weight_sync:\n  transport: tcp\n",
                                     "weight_sync:\n  transport: tcp\n  topology: chain\n  relay_port: 29600\n",
                                     "config/arlo.yaml")
            generated[("configMap", "arlo-config")]["arlo.yaml"] = arlo_yaml
            worker_yaml = generated[("configMap", "arlo-config")]["worker.yaml"]
            allowed = ", ".join(["arlo-trainer"] + [f"{w}.arlo-worker" for w in workers])
            worker_yaml = replace_once(worker_yaml, "allow_weights_from: [arlo-trainer]", f"allow_weights_from: [{allowed}]",
                                       "config/worker.yaml")
            generated[("configMap", "arlo-config")]["worker.yaml"] = worker_yaml

        mounts_of = {}
        for p in pods:
            volumes = {v["name"]: v for v in p.spec.get("volumes") or []}
            (c,) = p.spec["containers"]
            mounts = {}
            for m in c.get("volumeMounts") or []:
                v = volumes[m["name"]]
                if "persistentVolumeClaim" in v:
                    d = os.path.join(work, "claims", v["persistentVolumeClaim"]["claimName"])
                    os.makedirs(d, exist_ok=True)
                else:
                    kind = "configMap" if "configMap" in v else "secret"
                    ref = v[kind].get("name") or v[kind].get("secretName")
                    files = generated[(kind, ref)]
                    d = os.path.join(work, "pods", p.name, m["name"])
                    os.makedirs(d, exist_ok=True)
                    for item in v[kind].get("items") or [{"key": k, "path": k} for k in files]:
                        with open(os.path.join(d, item["path"]), "w") as fh:
                            fh.write(files[item["key"]])
                mounts[m["mountPath"]] = d
            mounts_of[p.name] = mounts

        def localize(text, mounts):
            for mount_path, d in sorted(mounts.items(), key=lambda kv: -len(kv[0])):
                text = text.replace(mount_path, d)
            return text

        # Mounted files name mount paths (token_file, run.dir): the same mapping inside them.
        for p in pods:
            for mount_path, d in mounts_of[p.name].items():
                if d.startswith(os.path.join(work, "pods")):
                    for f in os.listdir(d):
                        path = os.path.join(d, f)
                        with open(path) as fh:
                            text = fh.read()
                        with open(path, "w") as fh:
                            fh.write(localize(text, mounts_of[p.name]))

        # Start every pod.
        path_env = ":".join(bin_dirs + [os.environ.get("PATH", "/usr/bin:/bin")])
        for p in pods:
            (c,) = p.spec["containers"]
            argv_ = [localize(a.replace("$$", "$"), mounts_of[p.name]) for a in (c.get("command") or []) + (c.get("args") or [])]
            if p.name == "arlo-trainer":
                argv_ = [replace_once(a, "--max-steps 1285", f"--max-steps {STEPS}", "trainer.yaml") if "--max-steps" in a else a
                         for a in argv_]
                if topology == "chain":  # the trainer serves the first worker only
                    argv_ = [replace_once(a, '"expected_receivers": 2', '"expected_receivers": 1', "trainer.yaml")
                             if "expected_receivers" in a else a for a in argv_]
            env = {"PATH": path_env, "HOSTNAME": p.name, "HOME": work, "LANG": "C.UTF-8"}
            for e in c.get("env") or []:
                if "value" not in e:
                    fail(f"{p.name}: env {e['name']} is not a plain value; this test cannot provide it")
                env[e["name"]] = localize(e["value"], mounts_of[p.name])
            p.log = os.path.join(work, f"{p.name}.log")
            wrapper = ["ip", "netns", "exec", p.netns, "unshare", "--mount", "--propagation", "private", "/bin/sh", "-c",
                       'mount --bind "$0" /etc/hosts && cd "$HOME" && exec "$@"', hosts] + argv_
            with open(p.log, "w") as out:
                p.proc = subprocess.Popen(wrapper, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            print(f"pods_test: {p.name} at {p.ip}: {' '.join(argv_)[:160]}", flush=True)

        # The orchestrator's Job ends the run; the trainer's ends after --max-steps.
        orch, trainer = by_name["arlo-orchestrator"], by_name["arlo-trainer"]
        deadline = time.monotonic() + 420
        for p in (orch, trainer):
            while p.proc.poll() is None and time.monotonic() < deadline:
                for q in pods:
                    if q.proc.poll() is not None and q.workload["kind"] == "StatefulSet":
                        fail(f"{q.name} exited ({q.proc.returncode}):\n{tail(q.log)}")
                time.sleep(0.2)
            if p.proc.poll() is None:
                fail(f"{p.name} still runs after 420 s:\n{tail(p.log)}\n--- arlo-orchestrator:\n{tail(orch.log)}")
            if p.proc.returncode != 0:
                fail(f"{p.name} exited {p.proc.returncode}:\n{tail(p.log)}")

        run_dir = os.path.join(work, "claims", "arlo-orchestrator-run")
        with open(os.path.join(run_dir, "summary.json")) as fh:
            summary = json.load(fh)
        if not summary.get("ok") or summary.get("steps") != STEPS:
            fail(f"summary.json: ok {summary.get('ok')}, steps {summary.get('steps')} (wanted {STEPS})")
        checksum = summary["trainer"]["checksum"]
        if summary["trainer"]["version"] != STEPS:
            fail(f"the trainer ended on v{summary['trainer']['version']}, not v{STEPS}")
        workers = [p for p in pods if p.workload["kind"] == "StatefulSet"]
        if len(summary["workers"]) != len(workers):
            fail(f"summary.json has {len(summary['workers'])} workers, the StatefulSet {len(workers)}")
        for name, w in summary["workers"].items():
            if w.get("version") != STEPS or w.get("checksum") != checksum:
                fail(f"{name} holds v{w.get('version')} {w.get('checksum')}, not the trainer's v{STEPS} {checksum}")
        with open(orch.log) as fh:
            orch_text = fh.read()
        if f"{len(workers)} worker(s) healthy" not in orch_text:
            fail(f"the orchestrator did not wait for the workers:\n{tail(orch.log)}")
        if topology == "chain":
            with open(by_name["arlo-worker-1"].log) as fh:
                relayed = re.search(r"receiving weights v\d+ over tcp from arlo-worker-0\.arlo-worker:29600", fh.read())
            if not relayed:
                fail(f"arlo-worker-1 never pulled from arlo-worker-0's relay:\n{tail(by_name['arlo-worker-1'].log)}")
        print(f"pods_test: {len(pods)} pods on simulated hosts ({topology}): {STEPS} steps, every worker holds the trainer's "
              f"v{STEPS} ({checksum})", flush=True)
        return 0
    finally:
        for p in pods:
            if p.proc and p.proc.poll() is None:
                os.killpg(p.proc.pid, signal.SIGTERM)
        for p in pods:
            if p.proc:
                try:
                    p.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(p.proc.pid, signal.SIGKILL)
                    p.proc.wait()
        for n in made_netns:
            sh("ip", "netns", "del", n, check=False)
        for link in made_links:
            sh("ip", "link", "del", link, check=False)
        if os.environ.get("ARLO_KEEP_TEST_DIR"):
            print(f"pods_test: kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


def tail(path, lines=40):
    try:
        with open(path, errors="replace") as fh:
            return "".join(fh.readlines()[-lines:])
    except OSError as e:
        return f"({path}: {e})"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
