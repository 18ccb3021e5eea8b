"""A GRPO-shaped loop against a sandgym node or controller, training nothing.

What a trainer does each iteration, with its model replaced by a seeded stand-in: for each group,
one chat env of the task starts the episode and is forked into GROUP_SIZE envs that go on from
that state (set up once, each in its own sandbox); the "policy" answers each turn
with text holding Hermes-style tool calls (as an open model does), token ids and logprobs that
the stand-in makes up; the node runs the calls, grades the episode and returns rewards; the loop
computes group-relative advantages and writes each sample, token-level, to a JSONL file a
trainer would learn from.

    python3 grpo_loop.py --url grpc://127.0.0.1:7700 --token TOKEN --task hello-file \\
        --groups 2 --group-size 8 --out /tmp/grpo

The task path is one the node serves (its --task-root). Through a controller, give the tenant's
token; the controller routes every call to the node that holds the env.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Tuple

from sandgym import Platform
from sandgym.chat import ChatEnv


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


class StandInPolicy:
    """What the trainer's inference engine would be: an answer per turn, with its token ids and
    logprobs. Seeded, so a group holds right and wrong answers and its advantages are not all 0."""

    def __init__(self, seed: int) -> None:
        self.random = random.Random(seed)

    def answer(self, messages: List[dict], turn: int) -> Dict[str, Any]:
        if turn == 0:
            roll = self.random.random()
            if roll < 0.5:
                text = "I'll write the file.\n" + call("write_file", path="/app/hello.txt", content="hello sandgym\n")
            elif roll < 0.8:
                text = "Writing it.\n" + call("write_file", path="/app/hello.txt", content="hi\n")
            else:
                text = "<tool_call>{not json</tool_call>"  # what a model gets wrong: the env says so
        else:
            text = "Done.\n" + call("submit")
        token_ids = list(text.encode("utf-8"))  # a byte-level stand-in for the model's tokenizer
        logprobs = [round(-self.random.random(), 4) for _ in token_ids]
        return {"text": text, "token_ids": token_ids, "logprobs": logprobs}


def rollout(env: ChatEnv, prompt: List[dict], episode_id: str, seed: int) -> Dict[str, Any]:
    """One episode of the group, in a fork of the group's episode: the stand-in answers until the
    env ends the episode (or its turn budget does)."""
    policy = StandInPolicy(seed)
    turns: List[Dict[str, Any]] = []
    with env:
        messages = list(prompt)
        reward, terminated, truncated, info = 0.0, False, False, {}
        while not (terminated or truncated):
            answer = policy.answer(messages, len(turns))
            shown, reward, terminated, truncated, info = env.step(answer["text"], tokens=len(answer["token_ids"]))
            turns.append({**answer, "observations": shown})
            messages = messages + [{"role": "assistant", "content": answer["text"]}] + shown
    return {
        "episode_id": episode_id,
        "forked_from": env.forked_from["checkpointId"] if env.forked_from else None,
        "prompt": prompt,
        "turns": turns,
        "reward": float(reward),
        "terminated": terminated,
        "truncated": truncated,
        "outcome": info.get("outcome"),
    }


def group_of_forks(platform: Platform, task: str, name: str, size: int, max_turns: int) -> Tuple[List[dict], List[ChatEnv]]:
    """The group's episode started once (environment, services, staging), then forked: `size`
    envs going on from its first state, each in its own sandbox. The first env goes; its forks
    stay until their rollouts end."""
    with ChatEnv(platform, {"kind": "task", "path": task}, max_turns=max_turns) as first:
        prompt, _ = first.reset(options={"episode_id": name})
        return prompt, first.fork(size, episode_ids=[f"{name}-{i}" for i in range(size)])


def main(argv: List[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default=os.environ.get("SANDGYM_URL"), required="SANDGYM_URL" not in os.environ)
    parser.add_argument("--token", default=os.environ.get("SANDGYM_TOKEN"), required="SANDGYM_TOKEN" not in os.environ)
    parser.add_argument("--task", default="hello-file")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=4)
    parser.add_argument("--out", required=True, help="folder for samples.jsonl")
    args = parser.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    path = os.path.join(args.out, "samples.jsonl")
    summary = []
    with Platform.connect(args.url, args.token) as platform, open(path, "w", encoding="utf-8") as out:
        for group in range(args.groups):
            name = f"grpo-{os.getpid()}-g{group}"
            prompt, forks = group_of_forks(platform, args.task, name, args.group_size, args.max_turns)
            with ThreadPoolExecutor(max_workers=args.group_size) as pool:
                samples = list(
                    pool.map(
                        lambda i: rollout(forks[i], prompt, f"{name}-{i}", 1000 * group + i),
                        range(args.group_size),
                    )
                )
            rewards = [s["reward"] for s in samples]
            mean, spread = statistics.fmean(rewards), statistics.pstdev(rewards)
            for index, sample in enumerate(samples):
                # GRPO: each sample's advantage is its reward against its group's
                sample.update(group=group, index=index, advantage=(sample["reward"] - mean) / (spread + 1e-6))
                out.write(json.dumps(sample) + "\n")
            summary.append({"group": group, "rewards": rewards, "mean": mean})
    print(json.dumps({"samples": path, "groups": summary}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
