#!/usr/bin/env python3
"""eviction_bounds.py: how close can an online eviction policy get to Belady
on the Mooncake conversation trace? A block-level model (the trace's 512-token
hash blocks), with bounds that know part of the future, to put the replay's
figures (docs/eviction.md) in context.

    tests/bench/eviction_bounds.py ../shared/traces/mooncake/conversation_trace.jsonl
    tests/bench/eviction_bounds.py TRACE --capacities 1000000 --part second
    tests/bench/eviction_bounds.py TRACE --policies ghost_slru,belady --by-turn

Prints one JSON object per figure (the bench format; the baseline is LRU in
the same model) and a progress line per run on stderr. About 40 seconds.
With --by-turn, also each policy's hits split by the turn of the request that
hit (0: a conversation's first request, which hits only the block every
request shares; 1: its second, hitting the first turn's blocks; ... 4+).

The model: a pool of capacity/512 blocks; a request hits the longest run of
cached blocks from its first (min(run * 512, input_length) tokens), then
inserts its other blocks, evicting leaves (a block none of whose children is
cached) other than its own. The replay (`examples/replay`) works on 16-token
pages and radix-tree leaves (the last one split); on the whole trace its LRU
agrees with this model's within 0.003 and its Belady is 0.01-0.02 below (it
ranks a leaf by its first page's next use; docs/eviction.md).

Policies, each a key per block (the smallest leaf goes first):
  lru             last use
  ghost_slru      the library's policy (include/clm/cache/eviction_policy.hpp):
                  probation / protected (0.9 of the pool) with a ghost of 4
                  pool capacities; a remembered block comes back protected
  ghost_slru_whole_leaf
                  the same, admitting as the tree does: when the first new
                  block of a request is remembered, all its new blocks (the
                  new turn too) come back protected
  lrfu            LRFU (combined recency and frequency, half-life 240 s),
                  history kept while cached and in a ghost of 4 capacities
  arc, arc_ghost4 ARC, its ghosts one pool capacity each (the paper's) or 4
                  (ghost_slru's memory)
  lirs, lirs_hir20
                  LIRS with 1% of the pool for resident HIR blocks (the
                  paper's) or 20% (the best of 1-50% on the first half)
  wtinylfu        W-TinyLFU as Caffeine configures it: a 1% LRU window, an
                  SLRU main area (80% protected), admission to main by a
                  frequency count that halves every 10 pool capacities
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


def previous_turns(hash_lists):
    """The request each request continues (None: a conversation's first), as
    the replay links them (examples/replay/workload.cpp): the latest request
    that held the deepest of its blocks an earlier request holds, past block
    0 (everyone's system prompt)."""
    last_owner, previous = {}, [None] * len(hash_lists)
    for i, h in enumerate(hash_lists):
        for k in range(len(h) - 1, 0, -1):
            if h[k] in last_owner:
                previous[i] = last_owner[h[k]]
                break
        for b in h:
            last_owner[b] = i
    return previous


def conversation_turns(reqs):
    """Turn number of each request (0: first of its conversation) and the
    request that continues it (None: the conversation ends there; the last
    one when several do)."""
    turn, nxt = [0] * len(reqs), [None] * len(reqs)
    for i, p in enumerate(previous_turns([h for _, _, h in reqs])):
        if p is not None:
            turn[i], nxt[p] = turn[p] + 1, i
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
        if self.policy.own_order:
            return
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
        if self.policy.own_order:
            return self.policy.victim(self, locked)
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
    own_order = False  # True: the policy keeps its own lists and picks victims (victim())

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


def first_leaf(order, pool, locked):
    """The first block of `order` (oldest first) that can go: a leaf, not locked."""
    for b in order:
        if pool.children[b] == 0 and b not in locked:
            return b
    return None


class ListPolicy(Policy):
    """A policy of LRU lists, as the general-purpose caches below are written.
    A request's accesses are applied after it, its last block first, so that
    within a request the tail is the least recent (as the key (i, -j) of the
    others orders it); victims are the first leaves of the lists."""
    own_order = True

    def __init__(self):
        self.pending = []

    def key(self, i, now, j, b, hit):
        self.pending.append(b)
        return 0

    def after_request(self, pool):
        for b in reversed(self.pending):
            self.access(b)
        self.pending = []
        self.settle()

    def settle(self):
        pass


class Arc(ListPolicy):
    """ARC (Megiddo and Modha, FAST '03): T1 (seen once) and T2 (seen twice or
    more), ghosts B1 and B2 of what each evicted, and a target size p of T1
    that a ghost hit in B1 raises and one in B2 lowers. The ghosts are bounded
    by `memory` pool capacities each (ARC's own is one)."""

    def __init__(self, capacity_tokens, memory=1.0):
        super().__init__()
        self.c = capacity_tokens // BLOCK
        self.p = 0.0
        self.t1, self.t2, self.b1, self.b2 = (collections.OrderedDict() for _ in range(4))
        self.ghost_cap = int(memory * self.c)

    def access(self, b):
        if b in self.t1 or b in self.t2:
            self.t1.pop(b, None)
            self.t2.pop(b, None)
        elif b in self.b1:
            self.p = min(self.c, self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[b]
        elif b in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[b]
        else:
            self.t1[b] = True
            return
        self.t2[b] = True

    def victim(self, pool, locked):
        order = (self.t1, self.t2) if len(self.t1) > self.p or not self.t2 else (self.t2, self.t1)
        for lst in order:
            b = first_leaf(lst, pool, locked)
            if b is not None:
                return b
        return None

    def evicted(self, b):
        for lst, ghost in ((self.t1, self.b1), (self.t2, self.b2)):
            if lst.pop(b, None) is not None:
                ghost[b] = True
                while len(ghost) > self.ghost_cap:
                    ghost.popitem(last=False)


class Lirs(ListPolicy):
    """LIRS (Jiang and Zhang, SIGMETRICS '02): blocks with a small
    inter-reference recency (LIR) hold 1 - hir_fraction of the pool; the rest
    (resident HIR) is a FIFO queue that goes first. A block re-used while
    still in the recency stack S (resident or not) becomes LIR, and the LIR
    block at the bottom of S becomes HIR. S keeps non-resident history of
    `stack_memory` pool capacities. A request's blocks (about 24) outnumber a
    1% HIR queue, so with the paper's 1% an eviction often falls back to the
    LIR block at the bottom of S."""

    def __init__(self, capacity_tokens, hir_fraction=0.01, stack_memory=8.0):
        super().__init__()
        c = capacity_tokens // BLOCK
        self.lir_cap = max(1, c - max(1, int(hir_fraction * c)))
        self.stack = collections.OrderedDict()  # block -> is LIR, bottom first
        self.hir = collections.OrderedDict()  # resident HIR, eviction order
        self.lir = set()
        self.stack_cap = int(stack_memory * c)

    def prune(self):
        while self.stack:
            b, is_lir = next(iter(self.stack.items()))
            if is_lir:
                break
            del self.stack[b]

    def make_lir(self, b):
        self.lir.add(b)
        self.hir.pop(b, None)
        self.stack.pop(b, None)
        self.stack[b] = True
        if len(self.lir) > self.lir_cap:
            bottom = next(iter(self.stack))  # a LIR block after prune()
            del self.stack[bottom]
            self.lir.discard(bottom)
            self.hir[bottom] = True
            self.prune()

    def access(self, b):
        if b in self.lir:
            del self.stack[b]
            self.stack[b] = True
            self.prune()
        elif b in self.stack or len(self.lir) < self.lir_cap:
            self.make_lir(b)
        else:
            self.stack[b] = False
            self.hir.pop(b, None)
            self.hir[b] = True
            while len(self.stack) > self.stack_cap:
                old, is_lir = next(iter(self.stack.items()))
                if is_lir:
                    break
                del self.stack[old]

    def victim(self, pool, locked):
        b = first_leaf(self.hir, pool, locked)
        if b is None:
            b = first_leaf((x for x in self.stack if x in self.lir), pool, locked)
        return b

    def evicted(self, b):
        self.hir.pop(b, None)
        if b in self.lir:
            self.lir.discard(b)
            del self.stack[b]
            self.prune()


class WTinyLfu(ListPolicy):
    """W-TinyLFU (Einziger, Friedman and Manes, 2017; Caffeine): an LRU window
    of `window` of the pool, and a main SLRU area (probation, protected at
    `protected` of main). A block leaving the full window enters main only if
    its frequency beats main's victim's; frequencies are counted exactly here
    (not a sketch) and halved every 10 pool capacities of accesses."""

    def __init__(self, capacity_tokens, window=0.01, protected=0.8):
        super().__init__()
        self.c = capacity_tokens // BLOCK
        self.window_cap = max(1, int(window * self.c))
        self.main_cap = self.c - self.window_cap
        self.protected_cap = int(protected * self.main_cap)
        self.window, self.probation, self.protected = (collections.OrderedDict() for _ in range(3))
        self.freq, self.accesses, self.reset_at = collections.Counter(), 0, 10 * self.c

    def access(self, b):
        self.freq[b] += 1
        self.accesses += 1
        if self.accesses >= self.reset_at:
            self.accesses //= 2
            self.freq = collections.Counter({k: v // 2 for k, v in self.freq.items() if v > 1})
        if b in self.window:
            self.window.move_to_end(b)
        elif b in self.probation:
            del self.probation[b]
            self.protected[b] = True
        elif b in self.protected:
            self.protected.move_to_end(b)
        else:
            self.window[b] = True

    def settle(self):
        while len(self.protected) > self.protected_cap:
            b, _ = self.protected.popitem(last=False)
            self.probation[b] = True
        # while main has room the window's overflow enters it freely;
        # once it is full, admission decides in victim()
        while len(self.window) > self.window_cap and len(self.probation) + len(self.protected) < self.main_cap:
            b, _ = self.window.popitem(last=False)
            self.probation[b] = True

    def victim(self, pool, locked):
        if len(self.window) > self.window_cap:
            candidate = first_leaf(self.window, pool, locked)
            main = first_leaf(self.probation, pool, locked) or first_leaf(self.protected, pool, locked)
            if candidate is None or main is None:
                return main if candidate is None else candidate
            if self.freq[candidate] > self.freq[main]:  # admitted: main's victim goes
                del self.window[candidate]
                self.probation[candidate] = True
                return main
            return candidate
        for lst in (self.probation, self.protected, self.window):
            b = first_leaf(lst, pool, locked)
            if b is not None:
                return b
        return None

    def evicted(self, b):
        for lst in (self.window, self.probation, self.protected):
            if lst.pop(b, None) is not None:
                return


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


def replay(reqs, capacity, policy, turn=None):
    """The prompt hit rate; with `turn` (conversation_turns), also the hit
    tokens of the requests of each turn (0, 1, 2, 3, 4+) over all prompt tokens."""
    pool, hit, total = Pool(capacity, policy), 0, 0
    by_turn = [0] * 5
    for i, (now, n_tokens, h) in enumerate(reqs):
        got = pool.request(i, now, n_tokens, h)
        hit += got
        total += n_tokens
        if turn is not None:
            by_turn[min(turn[i], 4)] += got
    return (hit / total, [x / total for x in by_turn]) if turn is not None else hit / total


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--capacities", default="1000000,3000000")
    ap.add_argument("--part", choices=["all", "first", "second"], default="all",
                    help="the whole trace, or its first 6015 requests, or the rest")
    ap.add_argument("--policies", help="comma-separated names (default: all; LRU, the baseline, always runs)")
    ap.add_argument("--by-turn", action="store_true",
                    help="also the hits of each turn of a conversation (0, 1, 2, 3, 4+), over all prompt tokens")
    args = ap.parse_args()
    # the policies' lambdas see reqs, turn, nxt and nu, loaded below once the names are checked
    policies = {
        "lru": lambda cap: Lru(),
        "ghost_slru": lambda cap: GhostSlru(cap),
        "ghost_slru_whole_leaf": lambda cap: GhostSlruWholeLeaf(cap),
        "lrfu": lambda cap: Lrfu(cap),
        "arc": lambda cap: Arc(cap),
        "arc_ghost4": lambda cap: Arc(cap, memory=4.0),
        "lirs": lambda cap: Lirs(cap),
        "lirs_hir20": lambda cap: Lirs(cap, hir_fraction=0.2),
        "wtinylfu": lambda cap: WTinyLfu(cap),
        "class_density": lambda cap: ClassDensity(reqs, turn, nxt),
        "oracle_whether": lambda cap: OracleWhether(nu),
        "belady": lambda cap: Belady(nu),
    }
    chosen = args.policies.split(",") if args.policies else list(policies)
    unknown = [name for name in chosen if name not in policies]
    if unknown:
        ap.error(f"unknown policies {unknown}; known: {', '.join(policies)}")
    if "lru" not in chosen:
        chosen.insert(0, "lru")  # the baseline
    chosen.sort(key=lambda name: name != "lru")
    reqs = load(args.trace)
    if args.part != "all":
        reqs = reqs[:6015] if args.part == "first" else reqs[6015:]
    turn, nxt = conversation_turns(reqs)
    nu = next_uses(reqs)

    def figure(case, metric, value, base):
        print(json.dumps({"bench": "eviction_bounds", "case": case, "metric": metric, "value": round(value, 4),
                          "unit": "fraction", "baseline_metric": "lru_" + metric, "baseline": round(base, 4),
                          "ratio": round(value / base, 3) if base else None}), flush=True)

    for cap in (int(c) for c in args.capacities.split(",")):
        base = None
        for name in chosen:
            rate, by_turn = replay(reqs, cap, policies[name](cap), turn)
            base = base or (rate, by_turn)
            print(f"eviction_bounds: {args.part} {cap} {name} {rate:.4f}", file=sys.stderr, flush=True)
            case = f"mooncake_{args.part}_{cap}/{name}"
            figure(case, "prompt_hit_rate", rate, base[0])
            if args.by_turn:
                for t, share in enumerate(by_turn):
                    figure(f"{case}/turn{t}{'+' if t == 4 else ''}", "prompt_hit_rate_of_turn", share, base[1][t])


if __name__ == "__main__":
    main()
