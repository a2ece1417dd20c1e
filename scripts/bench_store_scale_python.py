"""The rendezvous of bench_store_scale with Python torch's TCPStore, the store torchrun uses.

    bench_store_scale_python.py RANKS

A TCPStore server in this process (as torchrun's agent hosts one) and RANKS threads, each with a
client connection of its own, each doing what torch.distributed's store-based barrier does when a
process group forms: add 1 to a counter, then poll it until every rank has arrived. Prints one JSON
line: connection and rendezvous times. (Threads share Python's interpreter lock, so the clients
here are slower than separate processes would be; the server is C++ and is not held back.)
"""
import datetime
import json
import sys
import threading
import time

import torch.distributed as dist


def main():
    ranks = int(sys.argv[1])
    timeout = datetime.timedelta(seconds=300)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False)
    connected = [0.0] * ranks
    done = [0.0] * ranks
    start = time.monotonic()

    def rank_main(rank):
        client = dist.TCPStore("127.0.0.1", server.port, None, False, timeout=timeout)
        connected[rank] = time.monotonic() - start
        client.add("barrier", 1)
        pause = 0.002
        while client.add("barrier", 0) < ranks:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
        done[rank] = time.monotonic() - start
        keep.append(client)

    keep = []
    threads = [threading.Thread(target=rank_main, args=(rank,)) for rank in range(ranks)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    print(json.dumps({"python_torch_ranks": ranks, "connected_s": round(max(connected), 3),
                      "rendezvous_s": round(max(done), 3)}), flush=True)


if __name__ == "__main__":
    main()
