"""A small llama-server HTTP client: health, slots, completions, metrics. Explicit timeouts."""

from __future__ import annotations

import httpx

TIMEOUT = httpx.Timeout(10.0, connect=2.0)


class LlamaClient:
    def __init__(self, base_url: str, api_key: str | None = None, timeout: httpx.Timeout = TIMEOUT) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=base_url, headers=headers, timeout=timeout, trust_env=False)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> "LlamaClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def health(self) -> int:
        """HTTP status of /health: 200 ready, 503 loading. Raises httpx.TransportError if not listening."""
        return self.http.get("/health", timeout=httpx.Timeout(2.0)).status_code

    def slots(self) -> list[dict]:
        r = self.http.get("/slots")
        r.raise_for_status()
        return r.json()

    def completion(self, prompt: str | list[int], n_predict: int, timeout: float = 120.0, **params) -> dict:
        """llama-server's native /completion (greedy unless told otherwise)."""
        body = {"prompt": prompt, "n_predict": n_predict, "temperature": 0.0, "cache_prompt": False, **params}
        r = self.http.post("/completion", json=body, timeout=httpx.Timeout(timeout, connect=2.0))
        r.raise_for_status()
        return r.json()

    def tokenize(self, text: str, add_special: bool = True) -> list[int]:
        r = self.http.post("/tokenize", json={"content": text, "add_special": add_special})
        r.raise_for_status()
        return r.json()["tokens"]

    def metrics(self) -> str:
        r = self.http.get("/metrics")
        r.raise_for_status()
        return r.text

