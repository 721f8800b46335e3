#!/usr/bin/env python3
"""hint_predictability.py: how well can a host predict, online, that a
conversation's next turn comes within S seconds? The replay's next-turn hint
(`replay --hint-next-turn-within S`, docs/eviction.md) is an oracle; this
measures the recall and false rate a hint learned from what a serving layer
sees would have, so that they can be replayed with --hint-recall and
--hint-false-rate.

    tests/bench/hint_predictability.py ../shared/traces/mooncake/conversation_trace.jsonl
    tests/bench/hint_predictability.py TRACE --within 120,300 --false-rates 0.1,0.2

What a host sees when a request arrives: the turn it is in (0 for a
conversation's first request), its prompt's length, and for a later turn the
time since the previous turn and the user's new message (this prompt less the
previous prompt and its answer). Conversations are linked as the replay links
them (eviction_bounds.previous_turns). The predictor: the rate of "next turn within S" per class
of those features (turn 0-4+, prompt size in doublings of 1,000 tokens, the
gap in doublings of 15 s, the message under 100 / 500 / 2,000 tokens or over),
learned on the first half of the trace (shrunk towards the overall rate with a
prior of 5 requests) and ranked on the second half. Hinting the top of that
ranking until a false rate q is spent gives the recall at q.

Prints one JSON object per figure (the bench format). The baseline is a coin:
a hint drawn at random with false rate q has recall q, so the ratio is how
many times better than chance the predictor is. Also the area under the ROC
curve (0.5 is a coin). A second or two.
"""
import argparse
import bisect
import json
import math

from eviction_bounds import previous_turns  # this script's folder is on sys.path


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def link(requests):
    """For each request: its previous turn (index or None), its turn number,
    and the seconds to its next turn, the first request that continues it
    (inf when there is none), as Request::seconds_to_next_turn."""
    previous = previous_turns([r["hash_ids"] for r in requests])
    turn = [0] * len(requests)
    to_next = [math.inf] * len(requests)
    for i, p in enumerate(previous):
        if p is not None:
            turn[i] = turn[p] + 1
            if to_next[p] == math.inf:
                to_next[p] = (requests[i]["timestamp"] - requests[p]["timestamp"]) / 1000
    return previous, turn, to_next


def features(requests, previous, turn, i):
    r = requests[i]
    size = min(int(math.log2(max(r["input_length"], 1) / 1000 + 1)), 4)
    p = previous[i]
    if p is None:
        return (min(turn[i], 4), size, None, None)
    gap = (r["timestamp"] - requests[p]["timestamp"]) / 1000
    gap_class = min(max(int(math.log2(max(gap, 1) / 15)), -1), 5)
    message = r["input_length"] - requests[p]["input_length"] - requests[p]["output_length"]
    message_class = 0 if message < 100 else 1 if message < 500 else 2 if message < 2000 else 3
    return (min(turn[i], 4), size, gap_class, message_class)


def auc(positive_scores, negative_scores):
    negatives = sorted(negative_scores)
    total = 0.0
    for s in positive_scores:
        below = bisect.bisect_left(negatives, s)
        ties = bisect.bisect_right(negatives, s) - below
        total += below + 0.5 * ties
    return total / (len(positive_scores) * len(negatives))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace")
    parser.add_argument("--within", default="120,300", help="next-turn windows S, seconds")
    parser.add_argument("--false-rates", default="0.05,0.1,0.2,0.3")
    args = parser.parse_args()
    requests = load(args.trace)
    if len(requests) < 4 or any("timestamp" not in r for r in requests):
        raise SystemExit("hint_predictability.py: a Mooncake trace with a timestamp on every line is needed")
    previous, turn, to_next = link(requests)
    classes = [features(requests, previous, turn, i) for i in range(len(requests))]
    half = len(requests) // 2
    for within in (float(w) for w in args.within.split(",")):
        comes_back = [t <= within for t in to_next]
        learned = {}
        for i in range(half):
            hits, seen = learned.get(classes[i], (0, 0))
            learned[classes[i]] = (hits + comes_back[i], seen + 1)
        prior = sum(comes_back[:half]) / half

        def score(i):
            hits, seen = learned.get(classes[i], (0, 0))
            return (hits + 5 * prior) / (seen + 5)

        test = range(half, len(requests))
        positives = [i for i in test if comes_back[i]]
        negatives = [i for i in test if not comes_back[i]]
        ranked = sorted(test, key=score, reverse=True)
        case = f"within {within:g} s, learned on the first half, ranked on the second"
        for false_rate in (float(q) for q in args.false_rates.split(",")):
            budget = false_rate * len(negatives)
            true_hints = false_hints = 0
            for i in ranked:  # ties broken by position: the class's rate is all the predictor knows
                if comes_back[i]:
                    true_hints += 1
                elif false_hints + 1 > budget:
                    break
                else:
                    false_hints += 1
            recall = true_hints / len(positives)
            print(json.dumps({"bench": "hint_predictability", "case": f"{case}, false rate {false_rate:g}",
                              "metric": "recall", "value": round(recall, 4), "unit": "fraction",
                              "baseline_metric": "recall of a random hint at this false rate",
                              "baseline": false_rate, "ratio": round(recall / false_rate, 3)}))
        area = auc([score(i) for i in positives], [score(i) for i in negatives])
        print(json.dumps({"bench": "hint_predictability", "case": case, "metric": "roc_auc", "value": round(area, 4),
                          "unit": "area", "baseline_metric": "a coin", "baseline": 0.5,
                          "ratio": round(area / 0.5, 3)}))


if __name__ == "__main__":
    main()
