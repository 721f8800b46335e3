#!/usr/bin/env python3
"""An independent KV-event subscriber (tests/events/CMakeLists.txt runs it).

It knows only the wire format (docs/fleet.md: three frames, topic, 8-byte
big-endian sequence, msgpack [ts, events, rank]; events as vLLM's tagged
arrays), through python3-zmq and python3-msgpack, not clmcache's decoder.
It starts kv_events_driver, subscribes after the driver has begun (so the
first batches are missed and must come back through replay), rebuilds the
set of blocks per medium, and checks it against the engine's own lists;
then restarts the driver on the same endpoints (a restarted instance:
sequence from 0, AllBlocksCleared first) and checks again.

With --replay-tool, it runs `replay` on gsp through the tiered path with
--kv-events and a linger, joins only after the run, fetches every batch
through replay, and checks its picture against the run's cached_pages.

    kv_events_subscriber.py DRIVER
    kv_events_subscriber.py --replay-tool REPLAY
"""
import json
import random
import socket
import subprocess
import sys
import time

import msgpack
import zmq


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Picture:
    """Blocks per medium, from the stream alone."""

    def __init__(self):
        self.tiers = {"GPU": set(), "CPU": set()}
        self.next_seq = None
        self.errors = []

    def apply(self, seq, payload):
        if self.next_seq is not None and seq == 0 and self.next_seq > 0:
            self.next_seq = 0  # a restarted publisher counts from 0 again
        if self.next_seq is not None and seq != self.next_seq:
            self.errors.append(f"sequence {seq}, expected {self.next_seq}")
        self.next_seq = seq + 1
        batch = msgpack.unpackb(payload, raw=False)
        if not (isinstance(batch, list) and len(batch) == 3 and isinstance(batch[0], float)):
            self.errors.append(f"batch {seq} is not [ts, events, rank]")
            return
        for event in batch[1]:
            tag = event[0]
            if tag == "AllBlocksCleared":
                for tier in self.tiers.values():
                    tier.clear()
            elif tag == "BlockStored":
                hashes, parent, tokens, block_size, medium = event[1], event[2], event[3], event[4], event[6]
                tier = self.tiers[medium]
                if len(tokens) != len(hashes) * block_size:
                    self.errors.append(f"{len(tokens)} tokens for {len(hashes)} blocks of {block_size}")
                if parent is not None and parent not in tier:
                    self.errors.append(f"parent {parent} unknown on {medium}")
                for h in hashes:
                    if h in tier:
                        self.errors.append(f"block {h} stored twice on {medium}")
                    tier.add(h)
            elif tag == "BlockRemoved":
                tier = self.tiers[event[2]]
                for h in event[1]:
                    if h not in tier:
                        self.errors.append(f"block {h} removed but not there")
                    tier.discard(h)
            else:
                self.errors.append(f"unknown event {tag}")


def replay(ctx, endpoint, start):
    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.RCVTIMEO, 5000)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart([b"", start.to_bytes(8, "big")])
    out = []
    while True:
        empty, seq, payload = dealer.recv_multipart()
        if seq == b"\xff" * 8:
            dealer.close()
            return out
        out.append((int.from_bytes(seq, "big"), payload))


def run_instance(driver, endpoint, replay_endpoint, seed, ctx, picture):
    # A socket per instance: libzmq 4.3.4's SUB, reconnected to a publisher
    # restarted on the same endpoint, receives nothing more (docs/fleet.md);
    # a router that sees an instance restart subscribes again.
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"kv@")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(endpoint)
    proc = subprocess.Popen([driver, endpoint, replay_endpoint, str(seed), "300"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        bound = json.loads(proc.stdout.readline())
        assert bound["endpoint"] == endpoint, bound
        time.sleep(0.5)  # the subscription reaches the new publisher; its first batch went out already
        proc.stdin.write("go\n")
        proc.stdin.flush()
        final = json.loads(proc.stdout.readline())
        time.sleep(0.2)
        live = {}
        while True:
            try:
                topic, seq, payload = sub.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                break
            assert topic == b"kv@driver@driver-model", topic
            live[int.from_bytes(seq, "big")] = payload
        # Whatever the subscriber missed of this instance comes back through replay.
        first_live = min(live) if live else None
        history = replay(ctx, replay_endpoint, 0)
        for seq, payload in history:
            if first_live is not None and seq >= first_live:
                if live[seq] != payload:
                    picture.errors.append(f"replayed batch {seq} differs from the live one")
                continue
            picture.apply(seq, payload)
        for seq in sorted(live):
            picture.apply(seq, live[seq])
        return final, len(live), len(history)
    finally:
        sub.close()
        proc.stdin.close()
        proc.wait(timeout=30)


def replay_tool(replay_binary):
    port, replay_port = free_port(), free_port()
    endpoint, replay_endpoint = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    args = [replay_binary, "--workload", "gsp", "--page-size", "16", "--capacity", "32768", "--l2-capacity",
            "65536", "--write-policy", "write_back", "--model-id", "replay-model", "--kv-events", endpoint,
            "--kv-events-replay", replay_endpoint, "--kv-events-linger", "20", "--json"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    failures = []
    try:
        figures = json.loads(proc.stdout.readline())  # printed before the linger
        ctx = zmq.Context()
        picture = Picture()
        history = replay(ctx, replay_endpoint, 0)
        for seq, payload in history:
            picture.apply(seq, payload)
        pages = figures["cached_pages"]
        events = figures["kv_events"]
        print(f"replay tool: {len(history)} batches fetched after the run, {events['published_events']} events; "
              f"{len(picture.tiers['GPU'])} / {pages['device']} device and {len(picture.tiers['CPU'])} / "
              f"{pages['host']} host pages; {figures['evictions']} evictions, {figures['loaded_pages']} loaded back")
        if len(history) != events["published_batches"]:
            failures.append(f"{len(history)} batches replayed of {events['published_batches']} published")
        if len(picture.tiers["GPU"]) != pages["device"] or len(picture.tiers["CPU"]) != pages["host"]:
            failures.append("the picture differs from the run's cached pages")
        if events["dropped_events"] != 0 or pages["device"] == 0 or pages["host"] == 0 or figures["evictions"] == 0:
            failures.append("dropped events, or a run that exercised too little")
        failures += picture.errors[:10]
    finally:
        proc.kill()
        proc.wait(timeout=30)
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


def main():
    if sys.argv[1] == "--replay-tool":
        replay_tool(sys.argv[2])
    driver = sys.argv[1]
    seed = random.randrange(1 << 30)
    print(f"seed {seed}")
    port, replay_port = free_port(), free_port()
    endpoint, replay_endpoint = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    ctx = zmq.Context()
    picture = Picture()
    failures = []
    for instance in range(2):  # the second is a restart on the same endpoints
        final, live, history = run_instance(driver, endpoint, replay_endpoint, seed + instance, ctx, picture)
        print(f"instance {instance}: {live} batches live, {history} in the replay buffer, "
              f"{len(final['gpu'])} GPU and {len(final['cpu'])} CPU blocks, {final['evictions']} evictions, "
              f"{final['loaded_pages']} pages loaded back")
        if picture.tiers["GPU"] != set(final["gpu"]):
            failures.append(f"instance {instance}: GPU picture differs from the engine's")
        if picture.tiers["CPU"] != set(final["cpu"]):
            failures.append(f"instance {instance}: CPU picture differs from the engine's")
        if not final["gpu"] or not final["cpu"] or final["evictions"] == 0 or final["loaded_pages"] == 0:
            failures.append(f"instance {instance}: the workload exercised too little")
        if live == 0 or live >= history:
            failures.append(f"instance {instance}: {live} batches live of {history}: neither live nor replay tested")
    failures += picture.errors[:10]
    for f in failures:
        print("FAIL:", f)
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
