#!/usr/bin/python3
"""deploy/kubernetes/check.py finds what it claims to find.

Every fixture under broken/ (a file, or a folder with a kustomization.yaml) lists the errors it
holds as `# expect: <regex>` lines: check.py must exit 1 and print exactly that many problems, each
matching one of them. Then the real manifests with one thing broken at a time (a copy in a temp
folder) must fail naming it, and the real manifests as they are must pass.

    check_test.py <source dir>
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import unittest

SOURCE = None


def run_check(*paths):
    p = subprocess.run([sys.executable, os.path.join(SOURCE, "deploy", "kubernetes", "check.py"), *paths],
                       capture_output=True, text=True, timeout=120)
    return p.returncode, p.stdout, p.stderr


def expectations(path):
    files = [path] if os.path.isfile(path) else [os.path.join(path, n) for n in sorted(os.listdir(path))]
    out = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            out += [m.group(1) for m in (re.match(r"# expect: (.*)$", line.rstrip("\n")) for line in fh) if m]
    return out


class BrokenFixtures(unittest.TestCase):
    def test_every_fixture_fails_with_exactly_its_errors(self):
        broken = os.path.join(os.path.dirname(os.path.abspath(__file__)), "broken")
        fixtures = sorted(os.path.join(broken, n) for n in os.listdir(broken))
        self.assertGreaterEqual(len(fixtures), 6)
        for fixture in fixtures:
            with self.subTest(fixture=os.path.basename(fixture)):
                expected = expectations(fixture)
                self.assertTrue(expected, f"{fixture} has no '# expect:' lines")
                rc, out, err = run_check(fixture)
                self.assertEqual(rc, 1, f"exit status {rc}\n{out}{err}")
                lines = [line for line in out.splitlines() if line.strip()]
                self.assertEqual(len(lines), len(expected), f"expected {len(expected)} problems, got:\n{out}")
                for pattern in expected:
                    self.assertTrue(any(re.search(pattern, line) for line in lines),
                                    f"no line matches {pattern!r} in:\n{out}")
                self.assertIn(f"{len(expected)} problem(s)", err)


class RealManifests(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="arlo-k8s-check-")
        shutil.copytree(os.path.join(SOURCE, "deploy", "kubernetes"), os.path.join(self.dir, "k8s"))
        self.k8s = os.path.join(self.dir, "k8s")

    def tearDown(self):
        shutil.rmtree(self.dir)

    def edit(self, name, old, new):
        path = os.path.join(self.k8s, name)
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        self.assertIn(old, text, f"{name} no longer holds {old!r}: update this test")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(text.replace(old, new, 1))

    def fails_naming(self, *expected):
        """check.py on the edited copy exits 1 and prints each of `expected`; returns what it printed."""
        rc, out, _ = run_check(self.k8s)
        self.assertEqual(rc, 1, out)
        for text in expected:
            self.assertIn(text, out)
        return out

    def test_they_pass_as_they_are(self):
        rc, out, err = run_check(self.k8s)
        self.assertEqual(rc, 0, out + err)
        self.assertRegex(out, r"check\.py: \d+ object\(s\) in 5 file\(s\)")

    def test_a_wrong_port_name_in_a_service_fails(self):
        self.edit("trainer.yaml", "targetPort: weights", "targetPort: weight")
        self.assertRegex(self.fails_naming(),
                         r"trainer\.yaml: document 1 \(Service/arlo-trainer\): spec\.ports\[0\]\.targetPort: 'weight' "
                         r"is not a container port name of the pods it selects \(Job/arlo-trainer: \['weights'\]\)")

    def test_a_worker_service_that_is_not_headless_fails(self):
        self.edit("workers.yaml", "  clusterIP: None", "  type: ClusterIP")
        self.fails_naming("workers.yaml: document 2 (StatefulSet/arlo-worker): spec.serviceName: Service 'arlo-worker' is not headless")

    def test_a_claim_or_a_secret_key_nobody_defines_fails(self):
        self.edit("orchestrator.yaml", "claimName: arlo-orchestrator-run", "claimName: arlo-run")
        self.edit("trainer.yaml", "items: [{key: token, path: token}]", "items: [{key: tokens, path: token}]")
        self.fails_naming("orchestrator.yaml: document 2 (Job/arlo-orchestrator): spec.template.spec.volumes[0]."
                          "persistentVolumeClaim.claimName: no PersistentVolumeClaim 'arlo-run' in the manifests",
                          "trainer.yaml: document 2 (Job/arlo-trainer): spec.template.spec.volumes[1].secret: "
                          "Secret 'arlo-token' has no key 'tokens' (it has: token)")

    def test_a_manifest_left_out_of_the_kustomization_fails(self):
        self.edit("kustomization.yaml", "  - storage.yaml\n", "")
        self.fails_naming("resources: storage.yaml is not listed")

    def test_an_unescaped_shell_substitution_fails(self):
        self.edit("trainer.yaml", "--run-dir /var/lib/arlo/run", "--run-dir $(pwd)/run")
        self.fails_naming("$(pwd) is not an env variable of this container")


if __name__ == "__main__":
    SOURCE = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.normpath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
    unittest.main(verbosity=2)
