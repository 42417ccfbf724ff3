"""The Python client against the real onnxopt-server on a loopback port: the example optimizes a model
end to end, an interrupted upload resumes where the server stopped, and refusals arrive as
OnnxoptError with the gRPC code. Run by ctest (tests/CMakeLists.txt) with Debian's python3:

    python_client_test.py SERVER_BINARY REPO_ROOT
"""
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

SERVER, REPO = sys.argv[1], sys.argv[2]
EXAMPLE = os.path.join(REPO, "client", "python", "examples", "optimize_model.py")
FIXTURES = os.path.join(REPO, "tests", "fixtures")

from onnxopt_client import Client, OnnxoptError  # noqa: E402  (PYTHONPATH comes from ctest)
from onnxopt.v1 import service_pb2  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PythonClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="onnxopt-python-")
        cls.address = f"127.0.0.1:{free_port()}"
        cls.log = open(os.path.join(cls.dir, "server.log"), "w")
        cls.server = subprocess.Popen(
            [SERVER, f"--listen={cls.address}", f"--data_dir={cls.dir}/data", "--workers=1", "--metrics_listen=127.0.0.1:0"],
            stdout=cls.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 60
        while True:
            try:
                with Client(cls.address) as client:
                    client.server_info()
                break
            except OnnxoptError:
                if time.time() > deadline or cls.server.poll() is not None:
                    raise RuntimeError(open(os.path.join(cls.dir, "server.log")).read())
                time.sleep(0.1)

    @classmethod
    def tearDownClass(cls):
        cls.server.send_signal(signal.SIGTERM)
        cls.server.wait(timeout=60)
        cls.log.close()
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_example_optimizes_a_model_end_to_end(self):
        out = os.path.join(self.dir, "out", "bert.onnx")
        run = subprocess.run([sys.executable, EXAMPLE, os.path.join(FIXTURES, "bert_tiny.onnx"), out,
                              "--server", self.address, "--dim", "sequence=16"],
                             capture_output=True, text=True, env=os.environ, timeout=600)
        self.assertEqual(run.returncode, 0, run.stderr + run.stdout)
        summary = json.loads(run.stdout)
        self.assertEqual(summary["state"], "SUCCEEDED")
        self.assertTrue(summary["parity_passed"])
        self.assertLess(summary["nodes_after"], summary["nodes_before"])
        with Client(self.address) as client:
            job = client.get_job(summary["job"])
        artifacts = {a.name: a.sha256 for a in job.result.artifacts}
        with open(out, "rb") as f:
            self.assertEqual(hashlib.sha256(f.read()).hexdigest(), artifacts["model.onnx"])
        with open(out + ".report.json") as f:
            report = json.load(f)
        self.assertIn("transformer (bert)", report["pipeline"])

    def test_an_interrupted_upload_resumes_where_the_server_stopped(self):
        path = os.path.join(self.dir, "blob.bin")
        with open(path, "wb") as f:
            f.write(os.urandom(3 * 1024 * 1024 + 123))
        with open(path, "rb") as f:
            content = f.read()
        digest = hashlib.sha256(content).hexdigest()
        size = len(content)
        upload_id = "python-resume-test"
        with Client(self.address) as client:
            # The first 2 MiB, then the stream ends without finish_write, as a dropped connection would.
            data = content[: 2 << 20]
            chunks = [service_pb2.UploadBlobRequest(sha256=digest, total_size=size, upload_id=upload_id, offset=0,
                                                    data=data[: 1 << 20]),
                      service_pb2.UploadBlobRequest(offset=1 << 20, data=data[1 << 20:])]
            try:
                client._stub.UploadBlob(iter(chunks))
            except Exception:  # the server may answer the unfinished stream with an error; the data stays
                pass
            result = client.upload_file(path, upload_id=upload_id)
            self.assertEqual(result.sha256, digest)
            self.assertEqual(result.resumed_from, 2 << 20)
            again = client.upload_file(path)
            self.assertEqual(again.resumed_from, size, "a blob the server has is not sent again")

    def test_refusals_carry_the_grpc_code_and_reason(self):
        with Client(self.address) as client:
            with self.assertRaises(OnnxoptError) as caught:
                client.get_job("jobs/does-not-exist")
            self.assertEqual(caught.exception.code, "NOT_FOUND")
            model = client.upload_model(os.path.join(FIXTURES, "cnn_tiny.onnx"))
            with self.assertRaises(OnnxoptError) as caught:
                client.create_job(model, {"preset": "no-such-preset"})
            self.assertEqual(caught.exception.code, "INVALID_ARGUMENT")
            self.assertIn("no-such-preset", caught.exception.message)
        run = subprocess.run([sys.executable, EXAMPLE, os.path.join(self.dir, "missing.onnx"), "x.onnx",
                              "--server", self.address], capture_output=True, text=True, env=os.environ)
        self.assertNotEqual(run.returncode, 0)


class PythonClientTlsTest(unittest.TestCase):
    """Mutual TLS: the client verifies the server with tls_ca and presents its own certificate."""

    def test_mutual_tls(self):
        folder = tempfile.mkdtemp(prefix="onnxopt-python-tls-")
        try:
            with open(os.path.join(folder, "san.ext"), "w") as f:
                f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
            run = lambda *args: subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)
            run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
                "-subj", "/CN=onnxopt-test-ca")
            for who in ("server", "client"):
                run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{who}.key", "-out", f"{who}.csr",
                    "-subj", "/CN=localhost")
                run("x509", "-req", "-in", f"{who}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                    "-out", f"{who}.pem", "-days", "2", "-extfile", "san.ext")
            path = lambda name: os.path.join(folder, name)
            address = f"127.0.0.1:{free_port()}"
            with open(path("server.log"), "w") as log:
                server = subprocess.Popen([SERVER, f"--listen={address}", f"--data_dir={folder}/data",
                                           "--metrics_listen=127.0.0.1:0", f"--tls_cert={path('server.pem')}",
                                           f"--tls_key={path('server.key')}", f"--tls_client_ca={path('ca.pem')}"],
                                          stdout=log, stderr=subprocess.STDOUT)
                try:
                    deadline = time.time() + 60
                    while True:
                        try:
                            with Client(address, tls_ca=path("ca.pem"), tls_cert=path("client.pem"),
                                        tls_key=path("client.key")) as client:
                                info = client.server_info()
                            break
                        except OnnxoptError:
                            if time.time() > deadline or server.poll() is not None:
                                raise
                            time.sleep(0.1)
                    self.assertTrue(info.version)
                    with self.assertRaises(OnnxoptError) as caught:
                        with Client(address, tls_ca=path("ca.pem")) as client:  # no client certificate
                            client.server_info()
                    self.assertEqual(caught.exception.code, "UNAVAILABLE")
                    with self.assertRaises(OnnxoptError):
                        Client(address, tls_ca=path("ca.pem"), tls_cert=path("client.pem"))  # no key
                finally:
                    server.send_signal(signal.SIGTERM)
                    server.wait(timeout=60)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


class PythonClientTokenTest(unittest.TestCase):
    """Bearer tokens: the client sends `token` (or $ONNXOPT_TOKEN) with every call, streams included."""

    def test_bearer_token(self):
        folder = tempfile.mkdtemp(prefix="onnxopt-python-token-")
        try:
            tokens = os.path.join(folder, "tokens.txt")
            with open(tokens, "w") as f:
                f.write(hashlib.sha256(b"python-token").hexdigest() + " team-py\n")
            address = f"127.0.0.1:{free_port()}"
            with open(os.path.join(folder, "server.log"), "w") as log:
                server = subprocess.Popen([SERVER, f"--listen={address}", f"--data_dir={folder}/data",
                                           "--metrics_listen=127.0.0.1:0", f"--auth_tokens_file={tokens}"],
                                          stdout=log, stderr=subprocess.STDOUT)
                try:
                    deadline = time.time() + 60
                    while True:
                        try:
                            with Client(address, token="python-token") as client:
                                client.server_info()
                            break
                        except OnnxoptError:
                            if time.time() > deadline or server.poll() is not None:
                                raise
                            time.sleep(0.1)
                    with Client(address, token="python-token") as client:
                        upload = client.upload_file(os.path.join(FIXTURES, "cnn_tiny.onnx"))  # a client stream
                        self.assertTrue(upload.sha256)
                    with self.assertRaises(OnnxoptError) as caught:
                        with Client(address) as client:
                            client.server_info()
                    self.assertEqual(caught.exception.code, "UNAUTHENTICATED")
                finally:
                    server.send_signal(signal.SIGTERM)
                    server.wait(timeout=60)
        finally:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
