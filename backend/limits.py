"""The upload limit: a request body larger than ``max_upload_bytes`` answers 413."""

import json

from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyLimit:
    """ASGI middleware: refuses by Content-Length at once, and counts chunked bodies."""

    def __init__(self, app: ASGIApp, max_bytes: int, whose: str = "") -> None:
        #: ``whose``: the limit's words for whom it holds (``gate.py``'s for strangers).
        self.app, self.max_bytes, self.whose = app, max_bytes, whose

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(send, int(length))
            return
        if length is not None:
            await self.app(scope, receive, send)
            return
        messages: list[Message] = []
        total = 0
        while True:
            message = await receive()
            messages.append(message)
            total += len(message.get("body", b""))
            if total > self.max_bytes:
                await self._refuse(send, total)
                return
            if message["type"] != "http.request" or not message.get("more_body"):
                break

        async def replay() -> Message:
            return messages.pop(0) if messages else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, send: Send, num_bytes: int) -> None:
        body = json.dumps(
            {
                "detail": f"the request body has {num_bytes} bytes, more than the "
                f"upload limit {self.whose}of {self.max_bytes} bytes"
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})
