"""TTFT of the person's follow-up turn served in the batch beside simulated users, with the
conversation's K/V kept in the pool between turns (engine/serving/scheduler.py: retain_kv) and without
(every turn prefills the whole conversation again). Alternating, in one process:

    python scripts/reuse_ttft.py [--model default] [--users 4] [--prompt-tokens 500] [--rounds 3]
"""
import argparse
import functools
import statistics
from dataclasses import replace

import engine.steps.batched as batched_module
from engine.bench.prompts import bench_prompt_ids
from engine.engine import Engine
from engine.events import DoneEvent
from engine.settings import Settings


def forget(request, *args, **kw):
    """A Request that does not keep its K/V when it ends (what every turn did before)."""
    return request(*args, **{**kw, "retain_kv": False})


def reply(eng, prompt):
    done = None
    for event in eng.generate(prompt, max_new_tokens=16):
        if isinstance(event, DoneEvent):
            done = event
    return done


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="default")
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--prompt-tokens", type=int, default=500)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    eng = Engine(args.model, dtype="fp32", max_context=2048, settings=Settings(dtype="fp32"))
    eng.apply(replace(eng.settings, users=args.users, sampling=replace(eng.settings.sampling, temperature=0.0)))
    for _ in range(20):  # the users' requests are running when the person's turns arrive
        eng.serve_step()
    text = bench_prompt_ids(eng.tokenizer, args.prompt_tokens + 64)
    request = batched_module.Request
    ttft: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.rounds):
        for reuse in (True, False):
            batched_module.Request = request if reuse else functools.partial(forget, request)
            prompt = text[: args.prompt_tokens + i]
            first = reply(eng, prompt)
            for _ in range(5):
                eng.serve_step()
            follow = prompt + eng.tokenizer.encode(first.text) + text[-40:]
            done = reply(eng, follow)
            ttft[reuse].append(done.ttft_s)
            print(f"round {i}, reuse {'on ' if reuse else 'off'}: follow-up of {len(follow)} tokens, "
                  f"TTFT {1e3 * done.ttft_s:,.0f} ms", flush=True)
            eng.reset()
    batched_module.Request = request
    on, off = (statistics.median(ttft[k]) for k in (True, False))
    print(f"median TTFT beside {args.users} users: {1e3 * on:,.0f} ms with reuse, {1e3 * off:,.0f} ms without "
          f"({off / on:.1f}x)")


if __name__ == "__main__":
    main()
