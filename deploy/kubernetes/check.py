#!/usr/bin/python3
"""Checks Kubernetes manifests against the API's own models, then checks what they refer to.

    deploy/kubernetes/check.py                    # the manifests next to this file
    deploy/kubernetes/check.py DIR_OR_FILE ...    # others (every *.yaml / *.yml of a directory)

Each YAML document is walked against the model class of its apiVersion/kind from the Kubernetes
Python client (Debian: python3-kubernetes; the models of its API version, 1.22 for 22.6):

- a field the model does not have is an error (kubectl would drop it or refuse it, either way it
  is a mistake), as is a value of the wrong type (a number where a string is wanted: env values,
  ConfigMap data, labels); quantities (resources, sizeLimit) take numbers or strings, int-or-string
  fields (targetPort, probe ports) either;
- the model constructors check required fields and enumerations;
- $(NAME) in command, args and env values names an env variable of the container (Kubernetes
  expands those and leaves the rest as written; a shell's $( ... ) is written $$( ... ));
- names are DNS-1123 where the API wants them, label keys and values are valid, container port
  names are at most 15 characters, a Job's pods restart OnFailure or Never.

Then across the documents (one namespace; a kustomization.yaml's generators count as objects):

- every Service selects the pods of some workload, and each of its ports reaches a container port
  of those pods (by number or by name);
- a StatefulSet's serviceName names a headless Service in the manifests;
- a workload's selector matches its own pod template's labels;
- every secretKeyRef / configMapKeyRef / envFrom / secret or configMap volume / projected source
  names an object in the manifests and, where a key is given, a key it holds (unless optional);
- every persistentVolumeClaim volume names a PersistentVolumeClaim in the manifests, and every
  volumeMount names a volume of its pod (or a StatefulSet's volumeClaimTemplate);
- a kustomization.yaml lists every manifest file next to it, and its configMapGenerator's files
  exist (a secretGenerator's files are made by whoever applies, so they are not in the repository).

Every error names the file, the document (1-based, with kind/name) and the field path. Exit status:
0 when everything checks, 1 when something does not (each problem on its own line, a file that is
not YAML included), 2 when a path does not exist or holds no YAML file.
"""
import os
import re
import sys

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit("check.py: PyYAML is missing (Debian: apt-get install python3-yaml)")
try:
    from kubernetes import client as k8s
    from kubernetes.client import models as k8s_models
except ImportError:  # pragma: no cover
    sys.exit("check.py: the Kubernetes Python client is missing (Debian: apt-get install python3-kubernetes)")

# apiVersion -> the kinds it serves. Only kinds listed here are accepted: a kind under the wrong
# apiVersion (Deployment in v1) or one this checker does not know is an error, not a silent pass.
API_KINDS = {
    "v1": ("ConfigMap", "Secret", "Service", "PersistentVolumeClaim", "Pod", "ServiceAccount", "Namespace"),
    "apps/v1": ("StatefulSet", "Deployment", "DaemonSet"),
    "batch/v1": ("Job",),
    "policy/v1": ("PodDisruptionBudget",),
    "networking.k8s.io/v1": ("NetworkPolicy",),
}
# apiVersion/kind -> the model class: the client names it by the version, V1Job for batch/v1 Job.
KINDS = {(api, kind): api.rpartition("/")[2].capitalize() + kind for api, kinds in API_KINDS.items() for kind in kinds}

# Fields of type resource.Quantity: the client types them as strings, the API takes numbers too.
QUANTITIES = {
    ("V1ResourceRequirements", "limits"),
    ("V1ResourceRequirements", "requests"),
    ("V1EmptyDirVolumeSource", "size_limit"),
    ("V1ResourceFieldSelector", "divisor"),
}

WORKLOADS = {"Pod", "Deployment", "StatefulSet", "DaemonSet", "Job"}

DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
LABEL_NAME = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$")
PORT_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
CONFIG_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")

# The model constructors run their own checks (required fields, enumerations) with this.
_STRICT = k8s.Configuration()
_STRICT.client_side_validation = True


class Doc:
    """One YAML document: where it came from and what it holds."""

    def __init__(self, path, index, body):
        self.path = path
        self.index = index
        self.body = body

    @property
    def kind(self):
        return self.body.get("kind", "?") if isinstance(self.body, dict) else "?"

    @property
    def name(self):
        meta = self.body.get("metadata") if isinstance(self.body, dict) else None
        return meta.get("name", "?") if isinstance(meta, dict) else "?"

    def where(self, path=""):
        at = f"{self.path}: document {self.index} ({self.kind}/{self.name})"
        return f"{at}: {path}" if path else at


class Checker:
    def __init__(self):
        self.errors = []

    def error(self, doc, path, message):
        self.errors.append(f"{doc.where(path)}: {message}")

    # ------------------------------------------------------------------ the schema walk

    def walk(self, doc, cls_name, value, path):
        """Checks `value` against model `cls_name`; returns the model object (None when broken)."""
        cls = getattr(k8s_models, cls_name)
        if not isinstance(value, dict):
            self.error(doc, path, f"expected an object ({cls_name}), found {type_name(value)}")
            return None
        json_to_attr = {j: a for a, j in cls.attribute_map.items()}
        kwargs = {}
        broken = False
        for key, item in value.items():
            sub = f"{path}.{key}" if path else str(key)
            attr = json_to_attr.get(key)
            if attr is None:
                near = [j for j in cls.attribute_map.values() if j.lower() == str(key).lower()]
                hint = f" (did you mean '{near[0]}'?)" if near else ""
                self.error(doc, sub, f"unknown field '{key}' in {cls_name}{hint}")
                broken = True
                continue
            if item is None:
                continue  # `key:` with nothing: the API treats it as absent
            converted, ok = self.convert(doc, cls.openapi_types[attr], item, sub, (cls_name, attr))
            broken |= not ok
            kwargs[attr] = converted
        try:
            return cls(local_vars_configuration=_STRICT, **kwargs)
        except ValueError as e:
            missing = re.search(r"Invalid value for `(\w+)`, must not be `None`", str(e))
            if missing:
                field = cls.attribute_map.get(missing.group(1), missing.group(1))
                self.error(doc, path or "(top)", f"required field '{field}' is missing ({cls_name})")
            else:
                self.error(doc, path or "(top)", f"{cls_name}: {e}")
            return None
        except TypeError as e:  # a child model that failed above leaves a wrong-typed argument
            if not broken:
                self.error(doc, path or "(top)", f"{cls_name}: {e}")
            return None

    def convert(self, doc, type_str, value, path, owner):
        """(converted value, ok) for `value` of OpenAPI client type `type_str`."""
        m = re.fullmatch(r"list\[(.+)\]", type_str)
        if m:
            if not isinstance(value, list):
                self.error(doc, path, f"expected a list, found {type_name(value)}")
                return None, False
            out, ok = [], True
            for i, item in enumerate(value):
                v, good = self.convert(doc, m.group(1), item, f"{path}[{i}]", owner)
                out.append(v)
                ok &= good
            return out, ok
        m = re.fullmatch(r"dict\(str, (.+)\)", type_str)
        if m:
            if not isinstance(value, dict):
                self.error(doc, path, f"expected a map, found {type_name(value)}")
                return None, False
            out, ok = {}, True
            for k, item in value.items():
                if not isinstance(k, str):
                    self.error(doc, f"{path}.{k}", f"map keys are strings; found {type_name(k)} (quote it)")
                    ok = False
                    continue
                quantity = owner in QUANTITIES
                v, good = self.convert(doc, "quantity" if quantity else m.group(1), item, f"{path}.{k}", owner)
                out[k] = v
                ok &= good
            return out, ok
        if owner in QUANTITIES and type_str == "str":
            type_str = "quantity"
        if type_str == "str":
            if not isinstance(value, str):
                self.error(doc, path, f"expected a string, found {type_name(value)} {value!r} (quote it)")
                return None, False
            return value, True
        if type_str == "int":
            if isinstance(value, bool) or not isinstance(value, int):
                self.error(doc, path, f"expected an integer, found {type_name(value)} {value!r}")
                return None, False
            return value, True
        if type_str == "float":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                self.error(doc, path, f"expected a number, found {type_name(value)} {value!r}")
                return None, False
            return value, True
        if type_str == "bool":
            if not isinstance(value, bool):
                self.error(doc, path, f"expected true or false, found {type_name(value)} {value!r}")
                return None, False
            return value, True
        if type_str in ("object", "quantity"):  # int-or-string, or a quantity
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                self.error(doc, path, f"expected a number or a string, found {type_name(value)}")
                return None, False
            return value, True
        if type_str in ("datetime", "date"):
            return value, True
        if hasattr(k8s_models, type_str):
            obj = self.walk(doc, type_str, value, path)
            return obj, obj is not None
        self.error(doc, path, f"the checker does not know the client type '{type_str}'")
        return None, False

    # ------------------------------------------------------------------ rules the models do not hold

    def check_names(self, doc):
        b = doc.body
        meta = b.get("metadata") or {}
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            self.error(doc, "metadata.name", "every object needs a name")
        elif len(name) > 253 or not DNS1123_SUBDOMAIN.match(name):
            self.error(doc, "metadata.name", f"'{name}' is not a DNS-1123 name (lower case, digits, '-', '.')")
        elif doc.kind in ("Service", "StatefulSet") and (len(name) > 63 or not DNS1123_LABEL.match(name)):
            self.error(doc, "metadata.name", f"a {doc.kind} name is a DNS label (no '.', at most 63): '{name}'")
        self.check_labels(doc, "metadata.labels", meta.get("labels"))
        for tpath, tmpl in pod_templates(doc):
            if tpath:  # a Pod's own labels are its metadata's, checked above
                self.check_labels(doc, f"{tpath}.metadata.labels", (tmpl.get("metadata") or {}).get("labels"))
            spec = tmpl.get("spec") or {}
            if doc.kind == "Job" and spec.get("restartPolicy") not in ("OnFailure", "Never"):
                self.error(doc, f"{tpath}.spec.restartPolicy",
                           f"a Job's pods need restartPolicy OnFailure or Never (found {spec.get('restartPolicy', 'none: Always')})")
            for cpath, c in containers(spec, join(tpath, "spec")):
                cname = c.get("name")
                if isinstance(cname, str) and not DNS1123_LABEL.match(cname):
                    self.error(doc, f"{cpath}.name", f"'{cname}' is not a DNS label")
                for i, p in enumerate(c.get("ports") or []):
                    pn = p.get("name") if isinstance(p, dict) else None
                    if isinstance(pn, str) and (len(pn) > 15 or not PORT_NAME.match(pn) or not re.search("[a-z]", pn)):
                        self.error(doc, f"{cpath}.ports[{i}].name",
                                   f"'{pn}' is not a port name (at most 15 of a-z, 0-9, '-', with a letter)")
        if doc.kind in ("ConfigMap", "Secret"):
            for field in ("data", "stringData", "binaryData"):
                for key in (b.get(field) or {}):
                    if not isinstance(key, str) or not CONFIG_KEY.match(key):
                        self.error(doc, f"{field}.{key}", f"'{key}' is not a valid key (a-z, A-Z, 0-9, '-', '_', '.')")

    def check_labels(self, doc, path, labels):
        if not isinstance(labels, dict):
            return
        for k, v in labels.items():
            prefix, _, name = str(k).rpartition("/")
            if not name or len(name) > 63 or not LABEL_NAME.match(name) or (prefix and not DNS1123_SUBDOMAIN.match(prefix)):
                self.error(doc, f"{path}.{k}", f"'{k}' is not a valid label key")
            if isinstance(v, str) and (len(v) > 63 or not LABEL_NAME.match(v)):
                self.error(doc, f"{path}.{k}", f"'{v}' is not a valid label value (at most 63 of A-Z, a-z, 0-9, '-', '_', '.')")


def join(path, field):
    return f"{path}.{field}" if path else field


# What an error calls the type of a YAML value, first match wins: bool before int (a bool is an int).
TYPE_NAMES = ((bool, "a boolean"), (int, "an integer"), (float, "a number"), (str, "a string"), (list, "a list"),
              (dict, "an object"), (type(None), "nothing"))


def type_name(v):
    return next((name for t, name in TYPE_NAMES if isinstance(v, t)), type(v).__name__)


def pod_templates(doc):
    """(path, pod template-like dict with metadata and spec) of a workload document."""
    b = doc.body
    spec = b.get("spec") if isinstance(b.get("spec"), dict) else {}
    if doc.kind == "Pod":
        return [("", b)]
    if doc.kind in WORKLOADS:
        t = spec.get("template")
        return [("spec.template", t)] if isinstance(t, dict) else []
    return []


def containers(pod_spec, path):
    out = []
    for field in ("initContainers", "containers"):
        for i, c in enumerate(pod_spec.get(field) or []):
            if isinstance(c, dict):
                out.append((f"{path}.{field}[{i}]", c))
    return out


# ---------------------------------------------------------------------- cross-references


class Objects:
    """What the manifests define: name -> keys (None: keys unknown), per kind."""

    def __init__(self):
        self.by_kind = {}

    def add(self, kind, name, keys, doc):
        self.by_kind.setdefault(kind, {})[name] = (keys, doc)

    def get(self, kind, name):
        return self.by_kind.get(kind, {}).get(name)


def cross_check(chk, docs, objects):
    workloads = []  # (doc, pod labels, pod spec, template path)
    for d in docs:
        for tpath, tmpl in pod_templates(d):
            labels = (tmpl.get("metadata") or {}).get("labels") or {}
            workloads.append((d, labels, tmpl.get("spec") or {}, tpath))

    for d, labels, spec, tpath in workloads:
        sel = ((d.body.get("spec") or {}).get("selector") or {}) if d.kind != "Pod" else {}
        ml = sel.get("matchLabels") or {}
        for k, v in ml.items():
            if labels.get(k) != v:
                chk.error(d, f"spec.selector.matchLabels.{k}",
                          f"{k}={v} does not match the pod template's labels ({fmt_labels(labels)})")
        check_pod_refs(chk, d, spec, join(tpath, "spec"), objects)

    for d in docs:
        if d.kind != "Service":
            continue
        spec = d.body.get("spec") or {}
        selector = spec.get("selector") or {}
        if not selector:
            continue  # a Service without a selector has its endpoints managed by hand
        matched = [(w, spec_) for w, labels, spec_, _ in workloads if all(labels.get(k) == v for k, v in selector.items())]
        if not matched:
            chk.error(d, "spec.selector", f"selects no pod in the manifests ({fmt_labels(selector)})")
            continue
        for i, p in enumerate(spec.get("ports") or []):
            target = p.get("targetPort", p.get("port"))
            names = {cp.get("name") for _, ps in matched for _, c in containers(ps, "") for cp in c.get("ports") or []}
            numbers = {cp.get("containerPort") for _, ps in matched for _, c in containers(ps, "") for cp in c.get("ports") or []}
            if isinstance(target, str) and target not in names:
                chk.error(d, f"spec.ports[{i}].targetPort",
                          f"'{target}' is not a container port name of the pods it selects "
                          f"({', '.join(w.kind + '/' + w.name for w, _ in matched)}: {sorted(n for n in names if n) or 'none named'})")
            elif isinstance(target, int) and target not in numbers:
                chk.error(d, f"spec.ports[{i}]",
                          f"port {target} is not a containerPort of the pods it selects "
                          f"({', '.join(w.kind + '/' + w.name for w, _ in matched)}: {sorted(n for n in numbers if n) or 'none'})")

    for d in docs:
        if d.kind != "StatefulSet":
            continue
        svc_name = (d.body.get("spec") or {}).get("serviceName")
        if not isinstance(svc_name, str):
            continue
        found = objects.get("Service", svc_name)
        if not found:
            chk.error(d, "spec.serviceName", f"no Service '{svc_name}' in the manifests (its pods' DNS names come from it)")
        elif (found[1].body.get("spec") or {}).get("clusterIP") != "None":
            chk.error(d, "spec.serviceName", f"Service '{svc_name}' is not headless (clusterIP: None): its pods get no DNS names")


def fmt_labels(labels):
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or "no labels"


def check_pod_refs(chk, d, spec, path, objects):
    volumes = {}
    for i, v in enumerate(spec.get("volumes") or []):
        if not isinstance(v, dict):
            continue
        volumes[v.get("name")] = v
        vp = f"{path}.volumes[{i}]"
        if "persistentVolumeClaim" in v:
            claim = (v["persistentVolumeClaim"] or {}).get("claimName")
            if not objects.get("PersistentVolumeClaim", claim):
                chk.error(d, f"{vp}.persistentVolumeClaim.claimName", f"no PersistentVolumeClaim '{claim}' in the manifests")
        if "secret" in v:
            s = v["secret"] or {}
            ref(chk, d, objects, "Secret", s.get("secretName"), [it.get("key") for it in s.get("items") or []],
                s.get("optional"), f"{vp}.secret")
        if "configMap" in v:
            c = v["configMap"] or {}
            ref(chk, d, objects, "ConfigMap", c.get("name"), [it.get("key") for it in c.get("items") or []],
                c.get("optional"), f"{vp}.configMap")
        for j, src in enumerate(((v.get("projected") or {}).get("sources")) or []):
            for kind, field in (("Secret", "secret"), ("ConfigMap", "configMap")):
                if field in src:
                    s = src[field] or {}
                    ref(chk, d, objects, kind, s.get("name"), [it.get("key") for it in s.get("items") or []],
                        s.get("optional"), f"{vp}.projected.sources[{j}].{field}")
    claim_templates = set()
    if d.kind == "StatefulSet":
        for t in (d.body.get("spec") or {}).get("volumeClaimTemplates") or []:
            claim_templates.add(((t or {}).get("metadata") or {}).get("name"))
    for cpath, c in containers(spec, path):
        for i, m in enumerate(c.get("volumeMounts") or []):
            n = m.get("name") if isinstance(m, dict) else None
            if n not in volumes and n not in claim_templates:
                chk.error(d, f"{cpath}.volumeMounts[{i}].name", f"no volume '{n}' in this pod")
        check_expansions(chk, d, c, cpath)
        for i, e in enumerate(c.get("env") or []):
            vf = (e or {}).get("valueFrom") or {}
            for kind, field in (("Secret", "secretKeyRef"), ("ConfigMap", "configMapKeyRef")):
                if field in vf:
                    r = vf[field] or {}
                    ref(chk, d, objects, kind, r.get("name"), [r.get("key")], r.get("optional"), f"{cpath}.env[{i}].valueFrom.{field}")
        for i, e in enumerate(c.get("envFrom") or []):
            for kind, field in (("Secret", "secretRef"), ("ConfigMap", "configMapRef")):
                if field in (e or {}):
                    r = e[field] or {}
                    ref(chk, d, objects, kind, r.get("name"), [], r.get("optional"), f"{cpath}.envFrom[{i}].{field}")


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def unescaped_references(text):
    """The NAMEs of $(NAME) that Kubernetes expands in `text` ($$ is an escaped $)."""
    out, i = [], 0
    while i < len(text):
        if text.startswith("$$", i):
            i += 2
        elif text.startswith("$(", i):
            end = text.find(")", i + 2)
            out.append(text[i + 2:end] if end >= 0 else text[i + 2:])
            i = end + 1 if end >= 0 else len(text)
        else:
            i += 1
    return out


def check_expansions(chk, d, c, cpath):
    """Kubernetes expands $(NAME) in command, args and env values from the env defined before; an
    unknown NAME stays as written, so `$(cmd)` meant for a shell works only by accident."""
    defined = set()
    fields = [(f"{cpath}.command[{i}]", v) for i, v in enumerate(c.get("command") or [])]
    fields += [(f"{cpath}.args[{i}]", v) for i, v in enumerate(c.get("args") or [])]
    envs = [(f"{cpath}.env[{i}].value", e) for i, e in enumerate(c.get("env") or []) if isinstance(e, dict)]
    for path, e in envs:
        for name in unescaped_references(e.get("value") or "") if isinstance(e.get("value"), str) else []:
            if name not in defined:
                chk.error(d, path, f"$({name}) names no variable defined before it in env (write $$( for a literal $()")
        defined.add(e.get("name"))
    for path, v in fields:
        for name in unescaped_references(v) if isinstance(v, str) else []:
            if not ENV_NAME.match(name) or name not in defined:
                chk.error(d, path, f"$({name}) is not an env variable of this container: Kubernetes leaves it as "
                                   f"written; a shell's $( ... ) is written $$( ... )")


def ref(chk, d, objects, kind, name, keys, optional, path):
    if optional:
        return
    found = objects.get(kind, name)
    if not found:
        chk.error(d, path, f"no {kind} '{name}' in the manifests")
        return
    held = found[0]
    for k in keys:
        if held is not None and k is not None and k not in held:
            chk.error(d, path, f"{kind} '{name}' has no key '{k}' (it has: {', '.join(sorted(held)) or 'none'})")


# ---------------------------------------------------------------------- kustomization


def check_kustomization(chk, path, body, manifest_files, objects):
    doc = Doc(path, 1, dict(body, kind="Kustomization", metadata={"name": "kustomization"}))
    base = os.path.dirname(path)
    allowed = {"apiVersion", "kind", "resources", "configMapGenerator", "secretGenerator", "generatorOptions",
               "namespace", "commonLabels", "labels", "images", "namePrefix", "nameSuffix"}
    for key in body:
        if key not in allowed:
            chk.error(doc, key, f"field '{key}' is not one this checker understands (it checks: {', '.join(sorted(allowed))})")
    if body.get("apiVersion") != "kustomize.config.k8s.io/v1beta1" or body.get("kind") != "Kustomization":
        chk.error(doc, "apiVersion", "expected apiVersion kustomize.config.k8s.io/v1beta1, kind Kustomization")
    if body.get("namePrefix") or body.get("nameSuffix"):
        chk.error(doc, "namePrefix", "namePrefix/nameSuffix rename objects; the cross-reference check does not follow them")
    listed = []
    for i, r in enumerate(body.get("resources") or []):
        full = os.path.normpath(os.path.join(base, r))
        listed.append(full)
        if not os.path.isfile(full):
            chk.error(doc, f"resources[{i}]", f"'{r}' does not exist")
    for f in manifest_files:
        if os.path.normpath(f) not in listed:
            chk.error(doc, "resources", f"{os.path.basename(f)} is not listed: `kubectl apply -k` would leave it out")
    for field, kind in (("configMapGenerator", "ConfigMap"), ("secretGenerator", "Secret")):
        for i, g in enumerate(body.get(field) or []):
            gp = f"{field}[{i}]"
            if not isinstance(g, dict) or not g.get("name"):
                chk.error(doc, gp, "a generator needs a name")
                continue
            keys = set()
            for j, f in enumerate(g.get("files") or []):
                key, _, file = f.partition("=") if "=" in f else (os.path.basename(f), "", f)
                keys.add(key)
                # A secret's files are made by whoever applies (they are not in the repository).
                if kind == "ConfigMap" and not os.path.isfile(os.path.join(base, file)):
                    chk.error(doc, f"{gp}.files[{j}]", f"'{file}' does not exist")
            for lit in g.get("literals") or []:
                keys.add(lit.partition("=")[0])
            objects.add(kind, g["name"], keys, doc)
    return doc


# ---------------------------------------------------------------------- main


def collect(args):
    files = []
    for a in args:
        if os.path.isdir(a):
            for n in sorted(os.listdir(a)):
                if n.endswith((".yaml", ".yml")):
                    files.append(os.path.join(a, n))
        elif os.path.isfile(a):
            files.append(a)
        else:
            print(f"check.py: {a}: no such file or directory", file=sys.stderr)
            sys.exit(2)
    return files


def main(argv):
    args = argv[1:] or [os.path.dirname(os.path.abspath(__file__))]
    if any(a in ("-h", "--help") for a in args):
        print(__doc__)
        return 0
    files = collect(args)
    if not files:
        print(f"check.py: no *.yaml files in {' '.join(args)}", file=sys.stderr)
        return 2
    chk = Checker()
    docs, kustomizations, manifest_files = [], [], []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                loaded = list(yaml.safe_load_all(fh))
        except (OSError, yaml.YAMLError) as e:
            chk.errors.append(f"{f}: cannot be read as YAML: {e}")
            continue
        if os.path.basename(f) in ("kustomization.yaml", "kustomization.yml"):
            kustomizations.append((f, loaded[0] if loaded else {}))
            continue
        manifest_files.append(f)
        for i, body in enumerate(loaded, start=1):
            if body is None:
                continue
            d = Doc(f, i, body)
            if not isinstance(body, dict):
                chk.error(d, "", f"a manifest is an object, found {type_name(body)}")
                continue
            cls = KINDS.get((body.get("apiVersion"), body.get("kind")))
            if cls is None:
                known = sorted(f"{v} {k}" for v, k in KINDS)
                chk.error(d, "apiVersion", f"{body.get('apiVersion')} {body.get('kind')} is not a kind this checker knows "
                                           f"({', '.join(known)})")
                continue
            chk.walk(d, cls, body, "")
            chk.check_names(d)
            docs.append(d)
    objects = Objects()
    for d in docs:
        keys = None
        if d.kind in ("ConfigMap", "Secret"):
            keys = set()
            for field in ("data", "stringData", "binaryData"):
                keys |= set((d.body.get(field) or {}).keys())
        if objects.get(d.kind, d.name):
            chk.error(d, "metadata.name", f"a second {d.kind} named '{d.name}' ({objects.get(d.kind, d.name)[1].where()})")
        objects.add(d.kind, d.name, keys, d)
    for f, body in kustomizations:
        check_kustomization(chk, f, body if isinstance(body, dict) else {}, [m for m in manifest_files
                                                                          if os.path.dirname(m) == os.path.dirname(f)], objects)
    cross_check(chk, docs, objects)
    for e in chk.errors:
        print(e)
    if chk.errors:
        print(f"check.py: {len(chk.errors)} problem(s) in {len(files)} file(s)", file=sys.stderr)
        return 1
    print(f"check.py: {len(docs)} object(s) in {len(files)} file(s) check against the Kubernetes "
          f"{k8s_version()} models and refer only to each other")
    return 0


def k8s_version():
    try:
        import kubernetes
        return f"client {kubernetes.__version__}"
    except Exception:  # pragma: no cover
        return "client"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
