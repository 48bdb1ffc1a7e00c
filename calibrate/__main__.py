"""``python -m calibrate calibrate ...`` / ``python -m calibrate runtimes ...``: the calibrator without
the rest of rlhfsim's CLI (for GPU images that have torch but not pydantic or simpy)."""

import click

from calibrate.cli import calibrate_command, runtimes_command


@click.group()
def main():
    """rlhfsim calibrator."""


main.add_command(calibrate_command)
main.add_command(runtimes_command)

if __name__ == "__main__":
    main()
