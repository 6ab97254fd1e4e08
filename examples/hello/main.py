"""examples/hello: the python function the demo deploys."""


def handle(payload: dict, context) -> dict:  # type: ignore[no-untyped-def, type-arg]
    name = (payload or {}).get("name", "world")
    return {"greeting": f"hello, {name}", "invocation": context.invocation_id}
