"""`hvdtrain ls` and `hvdtrain cp`: the shipped recipes, and a copy of one to edit.

A recipe is an option of the Hydra group `recipe`. The shipped ones lie in the package
(hvdtrain/conf/recipe/); a user's own lie in a folder of theirs as `DIR/recipe/NAME.yaml`, which
Hydra's `--config-dir DIR` adds to the search path, so `hvdtrain --config-dir DIR recipe=NAME` runs
one exactly as it runs a shipped recipe.
"""

import argparse
import shutil
import sys
from pathlib import Path

from omegaconf import OmegaConf

from hvdtrain.core.exits import EXIT_CONFIG
from hvdtrain.launch.compose import RECIPES_DIR

SUBCOMMANDS = ("ls", "cp")


def main(argv):
    parser = argparse.ArgumentParser(prog="hvdtrain", description="The shipped recipes.")
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("ls", help="list the recipes with their targets")
    copy = commands.add_parser("cp", help="copy a recipe into a folder of yours to edit it")
    copy.add_argument("recipe", help="a shipped recipe (see: hvdtrain ls)")
    copy.add_argument("name", help="the new recipe's name")
    copy.add_argument("--dir", default="conf", help="the config folder to copy into (default: ./conf)")
    args = parser.parse_args(argv)
    try:
        if args.command == "ls":
            print(listing())
        else:
            destination = copy_recipe(args.recipe, args.name, Path(args.dir))
            print(f"hvdtrain: copied {args.recipe} to {destination}; run it with: "
                  f"hvdtrain --config-dir {args.dir} recipe={args.name}")
    except ValueError as error:
        print(f"hvdtrain: {error}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)


def shipped():
    return sorted(path.stem for path in RECIPES_DIR.glob("*.yaml"))


def listing():
    """One row per shipped recipe: its name, what it is, and the result it targets."""
    rows = [("recipe", "what", "target")]
    for name in shipped():
        recipe = OmegaConf.load(RECIPES_DIR / f"{name}.yaml").get("recipe", {})
        target = recipe.get("target")
        rows.append((name, recipe.get("description", ""),
                     f"{target.metric} {target.value} ({target.source})" if target else "none"))
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}" for row in rows)


def copy_recipe(recipe, name, config_dir):
    if recipe not in shipped():
        raise ValueError(f"cp: unknown recipe {recipe!r}; shipped: {', '.join(shipped())}")
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ValueError(f"cp: {name!r} is not a recipe name (letters, digits, _ and - only)")
    destination = config_dir / "recipe" / f"{name}.yaml"
    if destination.exists():
        raise ValueError(f"cp: {destination} exists already; choose another name or remove it")
    if name in shipped():
        raise ValueError(f"cp: {name!r} is a shipped recipe's name, which the copy would shadow; choose another")
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RECIPES_DIR / f"{recipe}.yaml", destination)
    return destination
