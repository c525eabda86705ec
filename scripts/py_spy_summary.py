"""Where each thread of a process spent its time, from py-spy's raw (collapsed-stack) output:

    py-spy record --idle --threads --format raw -o profile.txt -- python some_script.py
    python scripts/py_spy_summary.py profile.txt [--top 15] [--within FUNCTION]

For each thread, its share of the samples, then the lines it was on most (self time: the
innermost Python frame, where time in C code such as a lock or a CUDA call counts too) and the
functions it was in most (inclusive time). --within keeps only the samples whose stack holds a
function of that name (say `median_round_trip`) in the threads that ever ran it, to leave out
their set-up and other phases; the other threads are kept whole.
Recorded with --idle, waiting counts (a lock's acquire, an Event's wait); with --gil, only the
thread holding the GIL is sampled, so the shares say who held it.
"""

import argparse
import collections


def parse(lines, within=None):
    """{thread: Counter of stacks (tuples of frames, outermost first)} from py-spy's raw lines,
    "thread (TID): NAME;frame;frame COUNT", frames as "function (file:line)". With `within`, a
    thread that ever ran that function keeps only the stacks that hold it."""
    by_id, names = collections.defaultdict(collections.Counter), {}
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        thread, *frames = stack.split(";")
        thread_id, _, name = thread.partition(": ")  # a thread's name appears once Python has named it
        by_id[thread_id][tuple(frames)] += int(count)
        names[thread_id] = name or names.get(thread_id) or thread_id
    threads = {names[thread_id]: stacks for thread_id, stacks in by_id.items()}
    if within is not None:
        for name, stacks in threads.items():
            holding = collections.Counter({frames: n for frames, n in stacks.items()
                                           if any(function_name(frame) == within for frame in frames)})
            if holding:
                threads[name] = holding
    return threads


def function_name(frame):
    """ "Engine._cycle (hvdtrain/core/engine.py:334)" -> "_cycle"."""
    return frame.split(" (")[0].rsplit(".", 1)[-1]


def function_of(frame):
    """ "Engine._cycle (hvdtrain/core/engine.py:334)" -> "Engine._cycle (hvdtrain/core/engine.py)"."""
    name, _, place = frame.partition(" (")
    return f"{name} ({place.rsplit(':', 1)[0]})" if place else name


def summary(threads, top):
    total = sum(sum(stacks.values()) for stacks in threads.values())
    lines = [f"{total} samples"]
    for thread, stacks in sorted(threads.items(), key=lambda item: -sum(item[1].values())):
        samples = sum(stacks.values())
        own, inclusive = collections.Counter(), collections.Counter()
        for frames, count in stacks.items():
            own[frames[-1] if frames else "(no Python frame)"] += count
            for function in {function_of(frame) for frame in frames}:
                inclusive[function] += count
        lines.append(f"\n## {thread}: {samples} samples, {100 * samples / total:.1f} % of all")
        lines.append("  self (the line it was on):")
        lines += [f"    {100 * n / samples:5.1f} %  {frame}" for frame, n in own.most_common(top)]
        lines.append("  inclusive (the functions it was in):")
        lines += [f"    {100 * n / samples:5.1f} %  {function}" for function, n in inclusive.most_common(top)]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", help="py-spy record --format raw output")
    parser.add_argument("--top", type=int, default=15, help="lines and functions shown a thread")
    parser.add_argument("--within", help="only samples whose stack holds a function of this name")
    args = parser.parse_args()
    with open(args.profile) as f:
        threads = parse(f, args.within)
    if not threads:
        raise SystemExit(f"{args.profile}: no samples" + (f" within {args.within}" if args.within else ""))
    print(summary(threads, args.top))


if __name__ == "__main__":
    main()
