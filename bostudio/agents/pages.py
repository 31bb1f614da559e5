"""Instructions bostudio gives an agent in place of its own, where a small model needs them (pure data).

Codex's own instructions are written for OpenAI's models and its full tool set. Qwen2.5-Coder-1.5B, given
them (or an earlier short page that did not name its habits), called `write_stdin` on sessions that never
existed, asked for file tools Codex does not have, and described work instead of doing it: 3 of 26 `codex
exec` runs of the hello task finished. The page below meets the model where it is (measured in session 19,
BENCHMARKS.md, "Coding agents on this machine"): it names one tool, shows the call as the fenced json block
such a model writes anyway (the daemon's tool rescue reads it), tells it that no command stays running for
`write_stdin`, and shows a file written with a heredoc. Its example is a Python file of another name that
prints something else: a small model copies the shape of an example (a shell-script example became
`echo hello` in hello.py, a function example a hello.py that defines and never calls a function)."""

from __future__ import annotations

# `bostudio launch codex` on a small model: Codex's `model_instructions_file` (it replaces Codex's own
# instructions; Codex still adds its permissions and environment context).
CODEX_SMALL_MODEL_PAGE = """\
You are a coding agent in a terminal on the user's computer. You do the user's task yourself, one shell \
command at a time, with the exec_command tool. Never tell the user to run something: run it.

Call exec_command by answering with only a block like this one:

```json
{"name": "exec_command", "arguments": {"cmd": "ls -la"}}
```

Rules:
1. Use exec_command for everything. write_stdin only talks to a command that is still running, and none is: \
never call write_stdin.
2. There is no file tool. Write a file with a heredoc, the whole file at once. For example, to write a Python \
script greet.py:
```json
{"name": "exec_command", "arguments": {"cmd": "cat > greet.py <<'EOF'\\nprint(\\"hi there\\")\\nEOF"}}
```
3. One call per answer, then wait for its output.
4. First write the files, then run them with exec_command to check them (for the example: python3 greet.py).
5. When the task is done and checked, answer with one short plain sentence and no block.
"""
