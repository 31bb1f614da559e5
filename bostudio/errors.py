"""The project's exception tree. Every error a user can cause is a BostudioError:
the CLI prints its message and hint on one line each and exits non-zero, never a traceback.

    BostudioError
    ├── ConfigError          bad config / TOML / command-line value
    ├── ModelError           a model cannot be found or resolved
    │   └── GGUFFormatError  a file is not a readable GGUF (truncated, crafted, ...)
    ├── EngineError          no usable llama-server, a failed probe
    │   └── BuildError       building llama.cpp failed or a toolchain is missing
    ├── ServerError          llama-server did not start, crashed or misbehaved
    │   ├── PortInUseError   the port we were asked to bind is taken
    │   └── OutOfMemoryError llama-server ran out of memory while loading
    ├── PlanError            a model (and speculator) cannot be planned onto the devices
    ├── DaemonError          the bostudio daemon is not running, refused, or failed a request
    └── RequestError         an API request the daemon rejects (bad or harmful parameters): HTTP 400
        └── ContextOverflowError  a prompt longer than the model's context
"""

from __future__ import annotations


class BostudioError(Exception):
    """An error meant for the user: a one-line message and a hint saying what to do."""

    title = "error"

    def __init__(self, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message


class ConfigError(BostudioError):
    title = "config error"


class ModelError(BostudioError):
    title = "model error"


class GGUFFormatError(ModelError):
    title = "GGUF format error"


class ModelFileError(ModelError):
    """The model file itself cannot be served (a broken or inconsistent header, a plan its own numbers
    rule out): a relaunch would fail the same way, so it is no crash to retry. The daemon answers 422."""

    title = "model file error"


class EngineError(BostudioError):
    title = "engine error"


class BuildError(EngineError):
    title = "build error"


class ServerError(BostudioError):
    title = "server error"


class PortInUseError(ServerError):
    title = "port in use"


class PlanError(BostudioError):
    title = "plan error"


class OutOfMemoryError(ServerError):
    title = "out of memory"


class DaemonError(BostudioError):
    title = "daemon error"


class RequestError(BostudioError):
    title = "bad request"

    code: str | None = None  # the OpenAI error code a client acts on, where there is one


class ContextOverflowError(RequestError):
    """A prompt longer than the context the model runs with. Worded as Anthropic's own 400 ("prompt is too
    long: N tokens > M maximum"), which Claude Code answers by compacting the conversation and sending it
    again; OpenAI clients (Codex, opencode) read the code `context_length_exceeded`."""

    code = "context_length_exceeded"
