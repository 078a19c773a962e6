"""``python -m threadweaver.verl_rollout.config`` prints the folder of our verl configs, for ``--config-path``."""

from pathlib import Path

CONFIG_DIR = Path(__file__).with_name("config")

if __name__ == "__main__":
    print(CONFIG_DIR)
