"""The one place the disk backend runs external commands. Every command is recorded
(argv, exit code, the tail of stderr) so the evidence lists exactly what ran. Secrets go
only through stdin, which is never recorded or logged; argv never carries key material."""
import logging
import subprocess
from collections import deque
from dataclasses import dataclass, field

from nodeagent.interfaces import CommandRecord, OperationFailed

log = logging.getLogger(__name__)

STDERR_KEPT = 2000          # characters of stderr kept per command in the evidence
RECENT_KEPT = 200           # the agent's long-lived runner keeps only its latest commands


@dataclass(frozen=True)
class Result:
    argv: list[str]
    exit: int
    stdout: str
    stderr: str


@dataclass
class Runner:
    """Runs commands and appends a CommandRecord per command to `commands` (the latest
    RECENT_KEPT for the agent's long-lived runner; all of them for a `recording()`)."""
    commands: deque[CommandRecord] | list[CommandRecord] = field(
        default_factory=lambda: deque(maxlen=RECENT_KEPT))
    timeout_s: int = 24 * 3600      # a block-erase sanitize of a large drive takes hours

    def recording(self) -> "Runner":
        """A fresh runner whose commands, all of them, make up one piece of evidence."""
        return Runner(commands=[], timeout_s=self.timeout_s)

    def run(self, argv: list[str], *, secret_stdin: bytes | None = None,
            check: bool = True, code: str = "disk_error") -> Result:
        argv = [str(a) for a in argv]
        try:
            proc = subprocess.run(argv, input=secret_stdin if secret_stdin is not None else b"",
                                  capture_output=True, timeout=self.timeout_s)
            exit_code, out, err = proc.returncode, proc.stdout, proc.stderr
        except FileNotFoundError:
            exit_code, out, err = 127, b"", f"{argv[0]}: command not found".encode()
        except subprocess.TimeoutExpired as exc:
            exit_code, out, err = 124, exc.stdout or b"", f"timed out after {self.timeout_s}s".encode()
        stderr = err.decode("utf-8", "replace")
        result = Result(argv, exit_code, out.decode("utf-8", "replace"), stderr)
        self.commands.append(CommandRecord(argv=argv, exit=exit_code, output=stderr[-STDERR_KEPT:]))
        log.info("disk command %s -> exit %d", argv, exit_code)
        if check and exit_code != 0:
            raise OperationFailed(code, f"{' '.join(argv)} exited {exit_code}: {stderr.strip()[-500:]}")
        return result
