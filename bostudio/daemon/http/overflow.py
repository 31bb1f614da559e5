"""A conversation longer than the model's context: the middle of its longest earlier texts is elided so that
it fits, instead of a 400 (LM Studio's "truncate middle" context overflow policy; `daemon --context-overflow`).

Why: an agent that keeps more than the context holds, and that nothing else will shorten, ends its session
on a 400. Codex 0.171 keeps the user's own messages verbatim through its compaction (up to about 20k tokens
of them), so on a 32k model the next long paste overflows; opencode 1.18 answers an overflow by compacting,
and its summary request carries the whole conversation, over the context again, so it compacts again, and
again. Claude Code compacts before it overflows, and is not affected.

What may be cut: the text of the conversation's turns before the last one (the current question stays
whole), never the system prompt, the instructions, tool definitions or a tool call's arguments. The longest
texts are shortened first, all to one common length (the short ones are kept whole), each from its middle
(a pasted log's head and tail say the most), with a marker that says how much went and why. The agent's own
transcript is untouched: only what this request shows the model is shorter.

Pure: a body in, a shortened copy and the characters elided out. The router counts the result with the
child's own tokenizer and tries again with a larger cut if it still does not fit.
"""

from __future__ import annotations

import copy

# The conversation's list in each API's body.
CONVERSATION_KEYS = {"/v1/chat/completions": "messages", "/v1/messages": "messages", "/v1/responses": "input"}
# The keys that hold text the model reads, in any API's turn (chat and Anthropic `content`, content parts'
# `text`, a Responses `function_call_output`'s `output`). Never `arguments`/`input` (a tool call's JSON).
TEXT_KEYS = ("content", "text", "output")
SYSTEM_ROLES = {"system", "developer"}
KEEP = 400  # characters a shortened text keeps at least, half from its head and half from its tail
MARK = ("\n[... {n:,} characters elided here by bostudio: the conversation was longer than the model's context "
        "of {ctx:,} tokens ...]\n")
MAX_DEPTH = 6


def conversation(path: str, body: dict) -> list | None:
    """The list of turns of a request to `path`, or None when the route has none (or it is not a list)."""
    key = CONVERSATION_KEYS.get(path)
    turns = body.get(key) if key else None
    return turns if isinstance(turns, list) else None


def _texts(node: object, out: list[tuple[dict | list, str | int]], depth: int = 0) -> None:
    """(container, key) of every text the model reads in `node`: strings under TEXT_KEYS, and the strings of
    a list under them (content as a list of strings)."""
    if depth > MAX_DEPTH:
        return
    if isinstance(node, dict):
        for key in TEXT_KEYS:
            v = node.get(key)
            if isinstance(v, str):
                out.append((node, key))
            elif isinstance(v, (list, dict)):
                _texts(v, out, depth + 1)
    elif isinstance(node, list):
        for i, item in enumerate(node):
            if isinstance(item, str):
                out.append((node, i))
            else:
                _texts(item, out, depth + 1)


def cuttable(path: str, body: dict) -> list[tuple[dict | list, str | int]]:
    """Where the texts are that may be shortened: every turn's but the last one's and the system's."""
    turns = conversation(path, body)
    if not turns or len(turns) < 2:
        return []
    out: list[tuple[dict | list, str | int]] = []
    for turn in turns[:-1]:
        if isinstance(turn, dict) and turn.get("role") in SYSTEM_ROLES:
            continue
        _texts(turn, out)
    return out


def _cap(lengths: list[int], need: int) -> int | None:
    """The largest common length L such that cutting every text longer than L down to L (plus its marker)
    removes at least `need` characters; None when even KEEP is not enough."""
    mark = len(MARK.format(n=10**9, ctx=10**7))

    def removed(cap: int) -> int:
        return sum(n - cap - mark for n in lengths if n - cap - mark > 0)

    if removed(KEEP) < need:
        return None
    lo, hi = KEEP, max(lengths)  # removed(lo) >= need; removed(hi) == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if removed(mid) >= need:
            lo = mid
        else:
            hi = mid
    return lo


def elide(path: str, body: dict, need_chars: int, ctx: int) -> tuple[dict, int]:
    """A copy of `body` with at least `need_chars` characters elided from the middle of its longest earlier
    texts (as many as can go when that is more than they hold), and how many went (0: nothing could)."""
    if need_chars <= 0:
        return body, 0
    out = copy.deepcopy(body)
    refs = cuttable(path, out)
    lengths = [len(c[k]) for c, k in refs]  # type: ignore[index]
    if not lengths:
        return body, 0
    cap = _cap(lengths, need_chars)
    if cap is None:
        cap = KEEP  # cut all there is to cut; the caller finds it still too long and refuses
    elided = 0
    for container, key in refs:
        text: str = container[key]  # type: ignore[index]
        mark_len = len(MARK.format(n=len(text), ctx=ctx))
        if len(text) - cap - mark_len <= 0:
            continue
        head = cap // 2
        tail = cap - head
        cut = len(text) - head - tail
        container[key] = text[:head] + MARK.format(n=cut, ctx=ctx) + text[len(text) - tail:]  # type: ignore[index]
        elided += cut
    return (out, elided) if elided else (body, 0)
