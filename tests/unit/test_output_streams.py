"""A process's stdout and stderr reach labctl as two streams that the engine relays as they come:
a line of one can arrive between two lines of the other, or between two chunks of one line. Lines
are made, filtered for the terminal and read for the verdict one stream at a time (CI of 2026-12-07:
a stdout line that landed inside torchrun's traceback let its whole report reach the terminal)."""

from rich.text import Text

from labctl.run.executor import _stream
from labctl.run.failures import stream_failures
from labctl.run.launch import Launch
from labctl.run.output import STDERR, STDOUT, Echo, NodeLogs
from labctl.run.result import Outcome

from failures.recorded import recorded_lines


class Replay:
    """An engine that hands over recorded chunks, each with its stream, in the order given."""

    def __init__(self, chunks: list[tuple[bytes, int]]):
        self.chunks = chunks

    def execute(self, launch, on_output) -> int:
        for chunk, fd in self.chunks:
            on_output(chunk, fd)
        return 1

    def node_lost(self, node: str, exit_code: int) -> None:
        return None


class Terminal:
    def __init__(self):
        self.printed: list[str] = []

    def print(self, text: str, **_) -> None:  # the line as the terminal shows it, less the node's label
        self.printed.append(Text.from_markup(text).plain.split(" | ", 1)[1])


def run_replayed(chunks, tmp_path):
    echo = Echo()
    echo.console = Terminal()
    outcome = Outcome(Launch("node1", "node1", ["python", "-m", "torch.distributed.run", "x.py"], {}))
    logs = NodeLogs(tmp_path)
    _stream(Replay(chunks), outcome, logs, "cyan", echo)
    logs.close()
    return outcome, echo.console.printed, (tmp_path / "node1.log").read_text().splitlines()


def test_a_stdout_line_inside_torchruns_traceback_leaves_it_held(tmp_path):
    lines = recorded_lines("raise", "node1")
    said = "FAIL_HOW rank=1 world=3 ready"
    errors = [line for line in lines if line != said]
    at = errors.index("    run(args)")
    split = errors[at + 1]
    chunks = [("".join(e + "\n" for e in errors[:at + 1]).encode(), STDERR),
              (split[:10].encode(), STDERR),  # one line in two chunks, stdout's line between them
              ((said + "\n").encode(), STDOUT),
              ((split[10:] + "\n").encode(), STDERR),
              ("".join(e + "\n" for e in errors[at + 2:]).encode(), STDERR)]
    outcome, printed, log = run_replayed(chunks, tmp_path)
    assert printed == [*errors[:4], said], printed  # the rank's own traceback, and stdout's line
    assert log == [*errors[:at + 1], said, *errors[at + 1:]]  # the log keeps them as they came
    assert outcome.streams == {STDERR: errors, STDOUT: [said]}
    failure, = stream_failures(outcome.stream(), 2026)
    assert (failure.rank, failure.error) == (1, "ValueError: deliberate failure on rank 1")


def test_a_last_line_without_its_newline_is_kept_for_each_stream(tmp_path):
    outcome, printed, _ = run_replayed([(b"out", STDOUT), (b"err", STDERR), (b"put", STDOUT)], tmp_path)
    assert sorted(printed) == ["err", "output"] and outcome.streams == {STDOUT: ["output"], STDERR: ["err"]}
