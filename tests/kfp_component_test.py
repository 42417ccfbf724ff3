#!/usr/bin/env python3
"""The Kubeflow Pipelines component (deploy/kubeflow/onnxopt-optimize.yaml), rendered as KFP renders a
container component (inputValue -> the value, inputPath -> a file holding the input, outputPath -> a
fresh path whose folder the step must create) and run against the real server with the real CLI.

    tests/kfp_component_test.py SERVER_BIN CLI_BIN REPO_ROOT
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import yaml

SERVER_BIN, CLI_BIN, REPO = (os.path.abspath(arg) for arg in sys.argv[1:4])
COMPONENT = os.path.join(REPO, "deploy", "kubeflow", "onnxopt-optimize.yaml")
MODEL = os.path.join(REPO, "tests", "fixtures", "bert_tiny.onnx")


def render(component, values, paths, outputs_dir):
    """The container's argv as KFP v1 builds it; returns (argv, {output name: path})."""
    declared_inputs = {i["name"]: i for i in component["inputs"]}
    declared_outputs = {o["name"] for o in component["outputs"]}
    output_paths = {}
    argv = []
    for item in component["implementation"]["container"]["command"]:
        if isinstance(item, str):
            argv.append(item)
        elif "inputValue" in item:
            name = item["inputValue"]
            assert name in declared_inputs, f"undeclared input {name}"
            argv.append(str(values.get(name, declared_inputs[name].get("default"))))
        elif "inputPath" in item:
            name = item["inputPath"]
            assert name in declared_inputs, f"undeclared input {name}"
            argv.append(paths[name])
        elif "outputPath" in item:
            name = item["outputPath"]
            assert name in declared_outputs, f"undeclared output {name}"
            output_paths[name] = os.path.join(outputs_dir, name, "data")  # KFP's layout; the folder is not made
            argv.append(output_paths[name])
        else:
            raise AssertionError(f"placeholder KFP has not: {item}")
    return argv, output_paths


class KfpComponentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="onnxopt-kfp-")
        port_file = os.path.join(cls.dir, "port")
        cls.server = subprocess.Popen(
            [SERVER_BIN, "--listen=127.0.0.1:0", "--metrics-listen=", "--workers=1",
             f"--data-dir={os.path.join(cls.dir, 'data')}", f"--port-file={port_file}"],
            stdout=open(os.path.join(cls.dir, "server.out"), "w"), stderr=subprocess.STDOUT)
        deadline = time.time() + 30
        while not os.path.exists(port_file) and time.time() < deadline:
            time.sleep(0.05)
        with open(port_file) as f:
            cls.address = "127.0.0.1:" + f.read().strip()
        with open(COMPONENT) as f:
            cls.component = yaml.safe_load(f)
        # The image puts /opt/onnxopt/bin on PATH; here the build's CLI stands in for it.
        cls.bin = os.path.join(cls.dir, "bin")
        os.makedirs(cls.bin)
        os.symlink(CLI_BIN, os.path.join(cls.bin, "onnxopt"))

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        cls.server.wait(60)
        shutil.rmtree(cls.dir, ignore_errors=True)

    def run_step(self, name, values):
        inputs = os.path.join(self.dir, name, "inputs")
        os.makedirs(inputs)
        model = os.path.join(inputs, "model")  # KFP names an artifact file by its input, no extension
        shutil.copy(MODEL, model)
        argv, outputs = render(self.component, dict(values, server=self.address), {"model": model},
                               os.path.join(self.dir, name, "outputs"))
        env = dict(os.environ, PATH=self.bin + os.pathsep + os.environ.get("PATH", ""))
        env.pop("ONNXOPT_SERVER", None)
        step = subprocess.run(argv, env=env, cwd=self.dir, capture_output=True, text=True, timeout=300)
        return step, outputs

    def cli(self, *args):
        return subprocess.run([CLI_BIN, "--server", self.address, *args], capture_output=True, text=True, timeout=60)

    def test_the_component_declares_what_its_command_uses(self):
        self.assertEqual(self.component["name"], "onnxopt optimize")
        self.assertEqual({o["name"] for o in self.component["outputs"]},
                         {"optimized_model", "mlpipeline_metrics", "report_html"})
        for declared in self.component["inputs"] + self.component["outputs"]:
            self.assertTrue(declared.get("description"), declared["name"])

    def test_a_rendered_step_outputs_the_model_metrics_and_report(self):
        step, outputs = self.run_step("ok", {"config": json.dumps({"benchmark": {"iterations": 20}}),
                                             "labels": "team=search,stage=ci", "timeout_seconds": 240})
        self.assertEqual(step.returncode, 0, step.stderr + step.stdout)
        with open(outputs["optimized_model"], "rb") as f:
            self.assertGreater(len(f.read()), 1000)
        with open(outputs["mlpipeline_metrics"]) as f:
            metrics = {m["name"]: m["numberValue"] for m in json.load(f)["metrics"]}
        self.assertGreater(metrics["speedup"], 0)
        self.assertGreater(metrics["optimized-p50-ms"], 0)
        self.assertLess(metrics["parity-max-abs-error"], 1e-3)
        with open(outputs["report_html"]) as f:
            self.assertIn("<html", f.read(2000).lower())
        job = step.stdout.split(":")[0].strip()
        self.assertTrue(job.startswith("jobs/"), step.stdout)
        self.assertIn(job, self.cli("list", "--label", "team=search", "--label", "stage=ci").stdout)
        # The model is the delivered one: onnxopt's producer and lineage.
        import onnx
        model = onnx.load(outputs["optimized_model"], load_external_data=False)
        self.assertEqual(model.producer_name, "onnxopt")
        self.assertEqual({p.key: p.value for p in model.metadata_props}["onnxopt.job"], job)

    def test_a_refused_config_fails_the_step_with_the_reason(self):
        step, outputs = self.run_step("bad", {"config": json.dumps({"preset": "no_such_preset"})})
        self.assertEqual(step.returncode, 5, step.stdout)
        self.assertIn("CONFIG_INVALID", step.stderr)
        self.assertFalse(os.path.exists(outputs["optimized_model"]))


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
