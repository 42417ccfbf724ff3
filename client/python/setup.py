"""Build hooks for the onnxopt-client package (metadata: pyproject.toml).

The gRPC stubs are generated at build time from the repository's proto/ folder into the build tree,
as the top-level package `onnxopt.v1` (protoc's layout for `package onnxopt.v1`, which the generated
modules import each other by), so the installed distribution carries them. The version is the
project's, read from the top-level CMakeLists.txt, so the client and the server never differ.
Both need the repository around this folder: install with `pip install ./client/python`.
"""
import glob
import importlib.util
import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
PROTO_DIR = os.path.join(REPO, "proto")
CMAKE_LISTS = os.path.join(REPO, "CMakeLists.txt")


def fail(message: str):
    sys.exit(f"onnxopt-client: {message}")


def project_version() -> str:
    if not os.path.isfile(CMAKE_LISTS):
        fail(f"{CMAKE_LISTS} not found: build the package from the onnxopt repository "
             "(pip install ./client/python), not from a copy of client/python alone")
    with open(CMAKE_LISTS, encoding="utf-8") as f:
        found = re.search(r"project\(\s*onnxopt\s+VERSION\s+([0-9][0-9A-Za-z.]*)", f.read())
    if not found:
        fail(f"no project(onnxopt VERSION x.y.z) in {CMAKE_LISTS}")
    return found.group(1)


def protoc_command(out_dir: str):
    """grpc_tools.protoc where it is importable (its protoc matches pip's protobuf), else protoc with
    Debian's grpc_python_plugin (protobuf-compiler, protobuf-compiler-grpc)."""
    if importlib.util.find_spec("grpc_tools") is not None:
        import grpc_tools
        includes = os.path.join(os.path.dirname(grpc_tools.__file__), "_proto")
        return [sys.executable, "-m", "grpc_tools.protoc", f"-I{includes}",
                f"--python_out={out_dir}", f"--grpc_python_out={out_dir}"]
    protoc = os.environ.get("PROTOC") or shutil.which("protoc")
    plugin = shutil.which("grpc_python_plugin")
    if not protoc or not plugin:
        fail("generating the gRPC stubs needs protoc and grpc_python_plugin (Debian: apt install "
             "protobuf-compiler protobuf-compiler-grpc) or the grpcio-tools package")
    return [protoc, f"--python_out={out_dir}", f"--grpc_python_out={out_dir}",
            f"--plugin=protoc-gen-grpc_python={plugin}"]


class BuildWithStubs(build_py):
    def run(self):
        # An in-tree build keeps client/python/build between installs: start it empty, so that nothing
        # stale (a module since removed, stubs of an older proto) reaches the wheel.
        shutil.rmtree(self.build_lib, ignore_errors=True)
        super().run()
        protos = sorted(glob.glob(os.path.join(PROTO_DIR, "onnxopt", "v1", "*.proto")))
        if not protos:
            fail(f"no .proto files in {PROTO_DIR}/onnxopt/v1: build the package from the onnxopt repository "
                 "(pip install ./client/python), whose proto/ folder it compiles")
        command = protoc_command(self.build_lib) + [f"-I{PROTO_DIR}"] + protos
        self.announce("generating the gRPC stubs: " + " ".join(command), level=2)
        if subprocess.run(command).returncode != 0:
            fail("protoc failed on " + " ".join(protos))
        for package in ("onnxopt", os.path.join("onnxopt", "v1")):
            with open(os.path.join(self.build_lib, package, "__init__.py"), "w") as f:
                f.write('"""Generated from onnxopt\'s proto/ by the onnxopt-client build."""\n')


setup(version=project_version(), cmdclass={"build_py": BuildWithStubs})
