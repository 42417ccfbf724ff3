#!/usr/bin/env python3
"""Optimize a model through onnxopt-server from Python: upload it (resumable chunks, SHA-256), queue a
job, watch it, download the optimized model and its report.

    PYTHONPATH=build/python:client/python /usr/bin/python3 client/python/examples/optimize_model.py \\
        tests/fixtures/bert_tiny.onnx out/bert_tiny.optimized.onnx --preset transformer

Prints one JSON object at the end: the job's name and state, the files written, nodes, speedup.
Exit codes as the CLI's: 0 ok, 1 job failed, 3 server error, 4 cancelled, 5 input rejected.
"""
import argparse
import json
import os
import sys

from onnxopt_client import Client, OnnxoptError
from onnxopt.v1 import service_pb2

REJECTED = {"INVALID_ARGUMENT", "NOT_FOUND", "DATA_LOSS", "FAILED_PRECONDITION", "OUT_OF_RANGE", "ALREADY_EXISTS"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("output")
    parser.add_argument("--server", default=os.environ.get("ONNXOPT_SERVER", "127.0.0.1:50051"))
    parser.add_argument("--preset", default="auto")
    parser.add_argument("--dim", action="append", default=[], help="NAME=N, a dynamic dimension for validation")
    parser.add_argument("--external-data", action="append", default=[], help="a data file the model references")
    parser.add_argument("--request-id", default="")
    args = parser.parse_args()

    config = {"preset": args.preset}
    for dim in args.dim:
        name, _, value = dim.partition("=")
        if not name or not value.isdigit() or int(value) < 1:
            parser.error(f"--dim {dim}: use NAME=N with N >= 1")
        config.setdefault("validation", {}).setdefault("dimValues", {})[name] = int(value)

    try:
        with Client(args.server) as client:
            model = client.upload_model(args.model, args.external_data,
                                        progress=lambda done, total: print(f"uploading {done}/{total} bytes",
                                                                           file=sys.stderr))
            job = client.create_job(model, config, request_id=args.request_id)
            print(f"queued {job.name}", file=sys.stderr)

            def show(event):
                state = service_pb2.JobState.Name(event.state)
                phase = service_pb2.JobPhase.Name(event.progress.phase)
                print(f"{event.name} {state} {phase} {event.progress.current_pass}", file=sys.stderr)

            job = client.wait(job.name, on_event=show)
            summary = {"job": job.name, "state": service_pb2.JobState.Name(job.state)}
            if job.state != service_pb2.SUCCEEDED:
                summary["error"] = job.error.message
                print(json.dumps(summary, indent=1))
                return 4 if job.state == service_pb2.CANCELLED else 1
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            folder = os.path.dirname(os.path.abspath(args.output))
            for artifact in job.result.artifacts:
                if artifact.name == "model.onnx":
                    target = args.output
                elif artifact.name == "report.json":
                    target = args.output + ".report.json"
                else:  # external data keeps the name the model uses
                    target = os.path.join(folder, artifact.name)
                client.download(job.name, target, artifact.name)
            summary.update({"model": args.output, "report": args.output + ".report.json",
                            "nodes_before": job.result.nodes_before, "nodes_after": job.result.nodes_after,
                            "parity_passed": job.result.parity_passed, "speedup": job.result.speedup})
            print(json.dumps(summary, indent=1))
            return 0
    except OnnxoptError as e:
        print(f"onnxopt: {e}", file=sys.stderr)
        return 5 if e.code in REJECTED else 3
    except OSError as e:  # a model or data file that cannot be read
        print(f"onnxopt: {e}", file=sys.stderr)
        return 5


if __name__ == "__main__":
    sys.exit(main())
