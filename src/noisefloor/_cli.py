"""What the four commands share on the command line: a group whose default subcommand needs no
name (`nfproxy --mode record` is `nfproxy run --mode record`), shows its options in the group's
own --help, and is not confused by an option placed before another subcommand
(`nfproxy --store X log` is `nfproxy log --store X`, never a proxy that runs `log`)."""

from __future__ import annotations

import difflib
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import click

from noisefloor import exit_codes
from noisefloor.display import visible
from noisefloor.errors import NoisefloorError

VERSION = {"package_name": "noisefloor", "message": "%(prog)s (noisefloor) %(version)s"}


class OneLineErrors:
    """A command whose `NoisefloorError`s reach the user as one line (`Error: ...`), and whose exit
    statuses follow `exit_codes`: usage mistakes 64, other errors 5, Ctrl-C 130."""

    interrupted = "Aborted!"  # the line Ctrl-C prints: a command that keeps its work says so

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)  # type: ignore[misc]
        try:
            rv = super().main(args, prog_name, complete_var, False, **extra)  # type: ignore[misc]
        except click.UsageError as exc:
            exc.show()
            sys.exit(exit_codes.USAGE)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exit_codes.INPUT)
        except (click.exceptions.Abort, KeyboardInterrupt):
            click.echo(self.interrupted, err=True)
            sys.exit(exit_codes.INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else exit_codes.OK)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)  # type: ignore[misc]
        except NoisefloorError as exc:
            raise click.ClickException(visible(str(exc))) from None

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)  # type: ignore[misc]
        with formatter.section("Exit statuses (the same for every noisefloor command; docs/exit-codes.md)"):
            formatter.write_dl(exit_codes.help_rows())


class Command(OneLineErrors, click.Command):
    pass


class Group(OneLineErrors, click.Group):
    command_class = Command  # its subcommands' --help lists the exit statuses too


class OneLineUsage(click.UsageError):
    """A usage error shown as its one line, without the usage text (a typo needs the fix, not the manual)."""

    def show(self, file: Any = None) -> None:
        click.echo(f"Error: {self.format_message()}", err=True)


class WrapsAfterDashes(Command):
    """A command whose trailing words (a command to wrap) are taken only after `--`: a mistyped
    subcommand (`nfproxy lgo --store x`) is a usage error naming the nearest subcommand, never a
    command to run."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        after = args[args.index("--") + 1:] if "--" in args else []
        rest = super().parse_args(ctx, args)
        words = list(ctx.params.get("command") or ())
        if words != after:
            stray = next(w for w in words[: len(words) - len(after)] or words)
            names = list(ctx.parent.command.commands) if ctx.parent and isinstance(ctx.parent.command, click.Group) else []
            near = difflib.get_close_matches(stray, names, n=1)
            hint = f" (did you mean `{ctx.parent.info_name if ctx.parent else ''} {near[0]}`?)" if near else ""
            raise OneLineUsage(f"no such command {visible(stray)!r}{hint}; to wrap a command, put it after `--`: "
                               f"{ctx.command_path} [OPTIONS] -- {visible(' '.join(words))}", ctx)
        return rest


class DefaultGroup(Group):
    default_command = "run"

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        head = args[: args.index("--")] if "--" in args else args
        named = next((i for i, a in enumerate(head) if a in self.commands), None)
        if named is not None and named > 0 and head[0].startswith("-") and head[0] not in ("--help", "-h", "--version"):
            args = [args[named], *args[:named], *args[named + 1:]]  # an option before the subcommand: move it
        elif not args or (args[0] not in self.commands and args[0] not in ("--help", "-h", "--version")):
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_options(ctx, formatter)
        default = self.commands.get(self.default_command)
        if default is None:
            return
        records = [r for p in default.get_params(ctx) if (r := p.get_help_record(ctx)) is not None
                   and not r[0].startswith("-h")]
        with formatter.section(f"Options of `{ctx.info_name} {self.default_command}` (the default, no name needed)"):
            formatter.write_dl(records)


def default_group(command: str, **kwargs: Any) -> Any:
    """`@click.group` with `DefaultGroup` defaulting to `command`, -h/--help and --version."""

    cls = type(f"DefaultTo{command.title()}", (DefaultGroup,), {"default_command": command})

    def wrap(f: Any) -> Any:
        group = click.group(cls=cls, context_settings={"help_option_names": ["-h", "--help"]}, **kwargs)(f)
        return click.version_option(**VERSION)(group)

    return wrap


def options(*decorators: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Several click options (or other decorators) as one decorator, shown in --help in the order
    listed: how a family of options is declared once and shared by every command that takes it."""

    def wrap(f: Any) -> Any:
        for d in reversed(decorators):
            f = d(f)
        return f

    return wrap


def progress_bar(label: str, enabled: bool | None = None, delay: float = 1.0,
                 final: bool = True) -> Callable[[int, int], None]:
    """A bar on stderr for long work: on a terminal (or when `enabled`), once it has taken `delay`
    seconds, with the rate; elsewhere only the final count (or nothing, without `final`)."""
    start = time.monotonic()
    show = sys.stderr.isatty() if enabled is None else enabled
    drawn = False

    def update(done: int, total: int) -> None:
        nonlocal drawn
        finished = done == total
        if not show and not (finished and final):
            return
        if show and not drawn and not finished and time.monotonic() - start < delay:
            return
        drawn = True
        rate = done / max(1e-9, time.monotonic() - start)
        filled = int(30 * done / max(1, total))
        sys.stderr.write(f"\r{label} [{'#' * filled}{' ' * (30 - filled)}] {done}/{total} ({rate:.1f}/s)")
        if finished:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return update


def exit_on_sigterm(grace: float = 20.0, hard_stop: Callable[[], None] = lambda: None) -> None:
    """SIGTERM ends the command with 143 through normal unwinding, so `finally` blocks stop the
    processes it started (for commands that own child processes and no signal handling of their own).

    The unwinding is bounded: a command still alive `grace` s after the signal (a wait that did
    not wake, a child that ignores its stop) prints every thread's stack, calls `hard_stop` (kill
    what it started) and exits 143 at once. SIGQUIT prints the stacks without stopping."""
    import faulthandler
    import signal

    faulthandler.register(signal.SIGQUIT, all_threads=True)

    def stop(signum: int, frame: Any) -> None:
        threading.Thread(target=_hard_exit_after, args=(grace, hard_stop), daemon=True,
                         name="nf-sigterm-deadline").start()
        raise SystemExit(exit_codes.TERMINATED)

    signal.signal(signal.SIGTERM, stop)


STUCK_AFTER_SIGTERM = "still running after SIGTERM"  # the line the deadline prints before the stacks


def _hard_exit_after(grace: float, hard_stop: Callable[[], None]) -> None:
    import faulthandler
    import os

    time.sleep(grace)
    sys.stderr.write(f"{sys.argv[0].rsplit('/', 1)[-1]}: {STUCK_AFTER_SIGTERM} ({grace:g} s): its threads were at\n")
    sys.stderr.flush()
    faulthandler.dump_traceback(sys.stderr, all_threads=True)
    try:
        hard_stop()
    finally:
        os._exit(exit_codes.TERMINATED)
