#!/usr/bin/env python3
"""eviction_bounds.py: how close can an online eviction policy get to Belady
on the Mooncake conversation trace? A block-level model (the trace's 512-token
hash blocks), with bounds that know part of the future, to put the replay's
figures (docs/eviction.md) in context.

    tests/bench/eviction_bounds.py ../shared/traces/mooncake/conversation_trace.jsonl
    tests/bench/eviction_bounds.py TRACE --capacities 1000000 --part second

Prints one JSON object per figure (the bench format; the baseline is LRU in
the same model) and a progress line per run on stderr. About two minutes.

The model: a pool of capacity/512 blocks; a request hits the longest run of
cached blocks from its first (min(run * 512, input_length) tokens), then
inserts its other blocks, evicting leaves (a block none of whose children is
cached) other than its own. The replay (`examples/replay`) works on 16-token
pages and radix-tree leaves (the last one split); on the whole trace its LRU
agrees with this model's within 0.003 and its Belady is 0.01-0.02 below (it
ranks a leaf by its first page's next use; docs/eviction.md).

Policies, each a key per block (the smallest leaf goes first):
  lru             last use
  ghost_slru      the library's policy (include/clm/eviction_policy.hpp):
                  probation / protected (0.9 of the pool) with a ghost of 4
                  pool capacities; a remembered block comes back protected
  ghost_slru_whole_leaf
                  the same, admitting as the tree does: when the first new
                  block of a request is remembered, all its new blocks (the
                  new turn too) come back protected
  lrfu            LRFU (combined recency and frequency, half-life 240 s),
                  history kept while cached and in a ghost of 4 capacities
  class_density   hit density by class and age (LHD-like, eviction by 64
                  samples), classes = (turn 0..4+, prompt size 2k..32k+); the
                  return-time statistics of each class are taken from the whole
                  trace, i.e. the future: a bound for policies that predict
                  from those features
  oracle_whether  knows whether a block is ever used again; never-again first,
                  LRU among the rest: what perfect knowledge of *whether*
                  (not *when*) is worth
  belady          knows the next use of every block (MIN)
"""
import argparse
import bisect
import collections
import heapq
import json
import math
import random
import sys

BLOCK = 512
NEVER = 1 << 60


def load(path):
    reqs = []
    with open(path) as f:
        for line in f:
            d = json.loads(line)
            reqs.append((d["timestamp"] / 1000.0, d["input_length"], d["hash_ids"]))
    return reqs


def conversation_turns(reqs):
    """Turn number of each request (0: first of its conversation) and the
    request that continues it (None: the conversation ends there)."""
    last_owner, turn, nxt = {}, [0] * len(reqs), [None] * len(reqs)
    for i, (_, _, h) in enumerate(reqs):
        for k in range(len(h) - 1, 0, -1):  # block 0 is everyone's
            if h[k] in last_owner:
                p = last_owner[h[k]]
                turn[i], nxt[p] = turn[p] + 1, i
                break
        for b in h:
            last_owner[b] = i
    return turn, nxt


def next_uses(reqs):
    """next_use[i][j]: the next request that uses block j of request i."""
    last, out = {}, [None] * len(reqs)
    for i in range(len(reqs) - 1, -1, -1):
        h = reqs[i][2]
        out[i] = [last.get(b, NEVER) for b in h]
        for b in h:
            last[b] = i
    return out


class Pool:
    """The cached blocks, their tree, and the leaves in a lazy min-heap of
    policy keys (or a sample-able list for sampled policies)."""

    def __init__(self, capacity_tokens, policy):
        self.cap = capacity_tokens // BLOCK
        self.policy = policy
        self.key, self.parent, self.children = {}, {}, collections.Counter()
        self.heap, self.version = [], {}
        self.leaves, self.leaf_at = [], {}

    def push(self, b):
        if self.policy.sampled:
            if b not in self.leaf_at:
                self.leaf_at[b] = len(self.leaves)
                self.leaves.append(b)
        else:
            v = self.version.get(b, 0) + 1
            self.version[b] = v
            heapq.heappush(self.heap, (self.key[b], v, b))

    def unleaf(self, b):
        if self.policy.sampled and b in self.leaf_at:
            at, last = self.leaf_at.pop(b), self.leaves.pop()
            if at < len(self.leaves):
                self.leaves[at], self.leaf_at[last] = last, at

    def pop_victim(self, locked, now):
        if self.policy.sampled:
            return self.policy.sample(self, locked, now)
        while self.heap:
            k, v, b = heapq.heappop(self.heap)
            if b in self.key and self.version[b] == v and self.children[b] == 0 and b not in locked:
                return b
        return None

    def evict(self, b):
        del self.key[b]
        self.unleaf(b)
        self.policy.evicted(b)
        p = self.parent.pop(b, None)
        if p is not None:
            self.children[p] -= 1
            if self.children[p] == 0 and p in self.key:
                self.push(p)

    def request(self, i, now, n_tokens, h):
        run = 0
        while run < len(h) and h[run] in self.key:
            run += 1
        locked = set(h)
        while len(self.key) + len(h) - run > self.cap:
            b = self.pop_victim(locked, now)
            if b is None:
                break
            self.evict(b)
        prev = None
        for j, b in enumerate(h):
            if b not in self.key:
                if len(self.key) >= self.cap:
                    break
                self.parent[b] = prev
                if prev is not None:
                    self.children[prev] += 1
                    self.unleaf(prev)
            self.key[b] = self.policy.key(i, now, j, b, j < run)
            if self.children[b] == 0:
                self.push(b)
            prev = b
        self.policy.after_request(self)
        return min(run * BLOCK, n_tokens)


class Policy:
    sampled = False

    def evicted(self, b):
        pass

    def after_request(self, pool):
        pass


class Lru(Policy):
    def key(self, i, now, j, b, hit):
        return (i, -j)


class GhostSlru(Policy):
    def __init__(self, capacity_tokens, protected_fraction=0.9, memory=4):
        self.protected_cap = int(protected_fraction * capacity_tokens // BLOCK)
        self.protected = collections.OrderedDict()  # block -> (i, -j), LRU first
        self.ghost, self.ghost_fifo = set(), collections.deque()
        self.ghost_cap = memory * capacity_tokens // BLOCK

    def key(self, i, now, j, b, hit):
        recency = (i, -j)
        if hit or b in self.protected or b in self.ghost:
            self.ghost.discard(b)
            self.protected[b] = recency
            self.protected.move_to_end(b)
            return (1,) + recency
        return (0,) + recency

    def evicted(self, b):
        if self.protected.pop(b, None) is None:  # only probation is remembered
            self.ghost.add(b)
            self.ghost_fifo.append(b)
            while len(self.ghost_fifo) > self.ghost_cap:
                self.ghost.discard(self.ghost_fifo.popleft())

    def after_request(self, pool):
        while len(self.protected) > self.protected_cap:
            b, recency = self.protected.popitem(last=False)
            pool.key[b] = (0,) + recency
            if pool.children[b] == 0:
                pool.push(b)


class GhostSlruWholeLeaf(GhostSlru):
    """The tree's admission: the new leaf's first page decides for the whole leaf."""

    def __init__(self, capacity_tokens):
        super().__init__(capacity_tokens)
        self.request, self.promote = None, None

    def key(self, i, now, j, b, hit):
        if self.request != i:
            self.request, self.promote = i, None
        if not hit:
            if self.promote is None:  # the first new block decides
                self.promote = b in self.ghost
            self.ghost.discard(b)  # a returning leaf's key is forgotten
        recency = (i, -j)
        if hit or b in self.protected or (not hit and self.promote):
            self.protected[b] = recency
            self.protected.move_to_end(b)
            return (1,) + recency
        return (0,) + recency


class Lrfu(Policy):
    """key = log2(sum over uses of 2^(t_use / half_life)): the order of
    CRF(t) = sum 2^(-(t - t_use) / half_life) at any time t, as a static key."""

    def __init__(self, capacity_tokens, half_life=240.0, memory=4):
        self.half_life, self.crf = half_life, {}
        self.cached, self.fifo = set(), collections.deque()
        self.ghost_cap = memory * capacity_tokens // BLOCK

    def key(self, i, now, j, b, hit):
        x, old = now / self.half_life, self.crf.get(b)
        v = x if old is None else max(old, x) + math.log2(1 + 2 ** -abs(old - x))
        self.crf[b] = v
        self.cached.add(b)
        return (v, -j)

    def evicted(self, b):
        self.cached.discard(b)
        self.fifo.append(b)
        while len(self.fifo) > self.ghost_cap:
            old = self.fifo.popleft()
            if old not in self.cached:
                self.crf.pop(old, None)


class ClassDensity(Policy):
    """Expected hits per block-second over the next `horizon` seconds, for a
    block of class c and age a: P(return in (a, a + horizon]) divided by the
    expected time it holds its space until then, from the class's return
    times over the whole trace."""

    sampled = True
    AGES = [0, 5, 10, 15, 20, 30, 40, 50, 60, 75, 90, 105, 120, 150, 180, 210, 240, 300, 360,
            420, 480, 600, 720, 900, 1200, 1500, 1800, 2400, 3000, 3600, NEVER]

    def __init__(self, reqs, turn, nxt, horizon=120.0, samples=64):
        self.rng, self.samples = random.Random(1), samples
        self.cls = [self.class_of(turn[i], reqs[i][1]) for i in range(len(reqs))]
        gaps, count = collections.defaultdict(list), collections.Counter()
        for i, c in enumerate(self.cls):
            count[c] += 1
            if nxt[i] is not None:
                gaps[c].append(reqs[nxt[i]][0] - reqs[i][0])
        self.table = {}
        for c in count:
            g = sorted(gaps[c])
            self.table[c] = [self.density(g, count[c], a, horizon) for a in self.AGES]

    @staticmethod
    def class_of(turn, n_tokens):
        size = 0
        while size < 4 and n_tokens >= 2000 << size:
            size += 1
        return (min(turn, 4), size)

    @staticmethod
    def density(gaps, n, age, horizon):
        lo, hi = bisect.bisect_right(gaps, age), bisect.bisect_right(gaps, age + horizon)
        alive = n - lo
        if alive <= 0:
            return 0.0
        held = sum(g - age for g in gaps[lo:hi]) + (alive - (hi - lo)) * horizon
        return (hi - lo) / held

    def key(self, i, now, j, b, hit):
        return (self.cls[i], now, j)

    def sample(self, pool, locked, now):
        best, best_value = None, None
        for _ in range(self.samples):
            b = pool.leaves[self.rng.randrange(len(pool.leaves))]
            if b in locked:
                continue
            c, t, j = pool.key[b]
            value = (self.table[c][bisect.bisect_right(self.AGES, now - t) - 1], -j)
            if best is None or value < best_value:
                best, best_value = b, value
        return best


class OracleWhether(Policy):
    def __init__(self, nu):
        self.nu = nu

    def key(self, i, now, j, b, hit):
        return (self.nu[i][j] != NEVER, i, -j)


class Belady(Policy):
    def __init__(self, nu):
        self.nu = nu

    def key(self, i, now, j, b, hit):
        return (-self.nu[i][j], -j)


def replay(reqs, capacity, policy):
    pool, hit, total = Pool(capacity, policy), 0, 0
    for i, (now, n_tokens, h) in enumerate(reqs):
        hit += pool.request(i, now, n_tokens, h)
        total += n_tokens
    return hit / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacities", default="1000000,3000000")
    ap.add_argument("--part", choices=["all", "first", "second"], default="all",
                    help="the whole trace, or its first 6015 requests, or the rest")
    args = ap.parse_args()
    reqs = load(args.trace)
    if args.part != "all":
        reqs = reqs[:6015] if args.part == "first" else reqs[6015:]
    turn, nxt = conversation_turns(reqs)
    nu = next_uses(reqs)
    policies = {
        "lru": lambda cap: Lru(),
        "ghost_slru": lambda cap: GhostSlru(cap),
        "ghost_slru_whole_leaf": lambda cap: GhostSlruWholeLeaf(cap),
        "lrfu": lambda cap: Lrfu(cap),
        "class_density": lambda cap: ClassDensity(reqs, turn, nxt),
        "oracle_whether": lambda cap: OracleWhether(nu),
        "belady": lambda cap: Belady(nu),
    }
    for cap in (int(c) for c in args.capacities.split(",")):
        base = None
        for name, make in policies.items():
            rate = replay(reqs, cap, make(cap))
            base = rate if base is None else base
            print(f"eviction_bounds: {args.part} {cap} {name} {rate:.4f}", file=sys.stderr, flush=True)
            print(json.dumps({"bench": "eviction_bounds", "case": f"mooncake_{args.part}_{cap}/{name}",
                              "metric": "prompt_hit_rate", "value": round(rate, 4), "unit": "fraction",
                              "baseline_metric": "lru_prompt_hit_rate", "baseline": round(base, 4),
                              "ratio": round(rate / base, 3)}), flush=True)


if __name__ == "__main__":
    main()
