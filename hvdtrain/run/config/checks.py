"""How a config is refused: one ConfigError naming every key at fault and what it may be.

Each section of the schema (recipe.py, cluster.py, ...) checks its own keys with a Problems
collector; config/__init__.py's `validate` runs them all, so that a user sees every problem of
a command line at once rather than one per attempt.
"""

from omegaconf import OmegaConf


class ConfigError(ValueError):
    """A config value that cannot run; the message names the key and what is allowed."""


def invalid(problem):
    """The ConfigError for one problem; `hvdtrain` prints it as `hvdtrain: invalid config: PROBLEM`."""
    return ConfigError(f"invalid config: {problem}")


class Problems:
    """What is wrong with one config, collected section by section."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.found = []

    def check(self, ok, key, message):
        """Unless `ok`, note `key`'s value and `message` (what is allowed)."""
        if not ok:
            value = OmegaConf.select(self.cfg, key, throw_on_missing=False)
            self.found.append(f"{key}={value!r}: {message}")

    def add(self, line):
        self.found.append(line)

    def raise_any(self):
        if len(self.found) == 1:
            raise ConfigError(f"invalid config: {self.found[0]}")
        if self.found:
            raise ConfigError("invalid config:\n" + "\n".join(f"  {problem}" for problem in self.found))
