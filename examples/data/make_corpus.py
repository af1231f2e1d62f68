"""Generates examples/data/tiny_tales.txt: a small original text corpus for the GPT example.

It is not a dataset loader (examples/gpt.py reads the text). The text is written for this repo
(public domain, CC0): short fables assembled from hand-written sentence templates with a fixed
seed, so re-running it reproduces the shipped file byte for byte.
"""

import random
import textwrap
from pathlib import Path

SEED = 1729
TARGET_BYTES = 40_000

ANIMALS = ["fox", "owl", "hare", "crow", "mole", "wren", "otter", "badger", "goat", "heron"]
PLACES = ["the old mill", "the river bank", "the hill", "the quiet wood", "the barley field",
          "the stone bridge", "the garden wall", "the harbour", "the orchard", "the marsh"]
THINGS = ["a lantern", "a silver key", "a loaf of bread", "a red ribbon", "a map", "a bell",
          "a jar of honey", "a feather", "a wooden boat", "a bag of seeds"]
WEATHER = ["The rain fell softly", "The wind was cold", "The sun was warm", "Snow lay on the ground",
           "Fog rolled in from the sea", "The night was clear and full of stars"]
FEELINGS = ["glad", "tired", "curious", "afraid", "proud", "hungry", "calm", "lonely"]
MORALS = [
    "A kind word costs nothing and is worth a great deal.",
    "Slow and careful work is seldom wasted.",
    "Those who share their bread never eat alone.",
    "A friend in the fog is better than a map in the sun.",
    "Pride runs ahead, but patience arrives.",
    "What is lost in a hurry is found with care.",
]

OPENING = """THE TINY TALES

These short tales were written for the OpenNeuron examples. They are plain and repetitive on
purpose: a small character-level model can learn their spelling, their rhythm and their little
morals in a few hundred steps, which makes it easy to see that training works.

"""


def sentence_pool(rng: random.Random, hero: str, friend: str, place: str, thing: str) -> list[str]:
    feeling = rng.choice(FEELINGS)
    return [
        f"One morning the {hero} walked to {place}.",
        f"{rng.choice(WEATHER)}, and the {hero} felt {feeling}.",
        f"At {place} the {hero} found {thing}.",
        f"\"What shall I do with {thing}?\" asked the {hero}.",
        f"The {friend} looked at it and said, \"Keep it safe, and it will keep you.\"",
        f"So the {hero} carried {thing} all the way home.",
        f"On the way the {hero} met the {friend}, who was {rng.choice(FEELINGS)}.",
        f"The {hero} gave the {friend} half of everything, and they sat together by the fire.",
        f"When evening came, the {hero} and the {friend} walked back past {rng.choice(PLACES)}.",
    ]


def tale(rng: random.Random, number: int) -> str:
    hero, friend = rng.sample(ANIMALS, 2)
    place, thing = rng.choice(PLACES), rng.choice(THINGS)
    pool = sentence_pool(rng, hero, friend, place, thing)
    body = [pool[0], pool[1], pool[2]] + rng.sample(pool[3:], 4)
    title = f"{number}. The {hero.capitalize()} and the {friend.capitalize()}"
    return f"{title}\n\n{textwrap.fill(' '.join(body), 96)}\n{rng.choice(MORALS)}\n\n"


def main() -> None:
    rng = random.Random(SEED)
    parts, size, number = [OPENING], len(OPENING), 1
    while size < TARGET_BYTES:
        part = tale(rng, number)
        parts.append(part)
        size += len(part)
        number += 1
    out = Path(__file__).with_name("tiny_tales.txt")
    out.write_text("".join(parts), encoding="ascii")
    print(f"wrote {out} ({size} bytes, {number - 1} tales)")


if __name__ == "__main__":
    main()
