"""Stream a generation from Triton Inference Server over gRPC with `tritonclient`.

    specdeploy triton engine.plan -o repo/ && scripts/tritonserver.sh repo/ &
    python examples/triton_client.py localhost:8001 "Why is the sky blue?"
"""
import queue
import sys

import numpy as np
import tritonclient.grpc as grpcclient


def tensor(name, value, kind):
    t = grpcclient.InferInput(name, [1], kind)
    t.set_data_from_numpy(np.array([value], dtype=object if kind == "BYTES" else None))
    return t


def main(address: str, prompt: str) -> None:
    client, responses = grpcclient.InferenceServerClient(address), queue.Queue()
    client.start_stream(callback=lambda result, error: responses.put((result, error)))
    inputs = [tensor("text_input", prompt.encode(), "BYTES"), tensor("stream", True, "BOOL"),
              tensor("max_tokens", np.int32(64), "INT32")]
    client.async_stream_infer("specdeploy", inputs)
    while True:
        result, error = responses.get(timeout=120)
        if error is not None:
            sys.exit(f"Error: {error}")
        print(result.as_numpy("text_output")[0].decode(), end="", flush=True)
        if result.as_numpy("tokens_per_round") is not None:  # the final response carries the statistics
            print(f"\n[{result.as_numpy('draft_source')[0].decode()}] "
                  f"{result.as_numpy('completion_tokens')[0]} tokens, "
                  f"acceptance {result.as_numpy('acceptance_rate')[0]:.1%}, "
                  f"{result.as_numpy('tokens_per_round')[0]:.2f} tokens/round")
            break
    client.stop_stream()
    client.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "Hello!")
