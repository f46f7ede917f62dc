"""20 built-in structured-output requests (`--dataset structured`): a prompt and the JSON schema its answer must
follow (OpenAI's `response_format: {"type": "json_schema"}`), from small records to nested lists."""
from __future__ import annotations

import json

_S, _I, _N, _B = {"type": "string"}, {"type": "integer"}, {"type": "number"}, {"type": "boolean"}


def _obj(props: dict, required: list[str] | None = None) -> dict:
    return {"type": "object", "properties": props, "required": required or list(props),
            "additionalProperties": False}


def _arr(items: dict, lo: int = 1, hi: int = 5) -> dict:
    return {"type": "array", "items": items, "minItems": lo, "maxItems": hi}


_CASES = [
    ("Describe Ada Lovelace as a person record.", _obj({"name": _S, "born": _I, "died": _I, "known_for": _S})),
    ("Give the product details of a mid-range laptop.",
     _obj({"name": _S, "price_usd": _N, "in_stock": _B, "specs": _obj({"cpu": _S, "ram_gb": _I, "ssd_gb": _I})})),
    ("Write the postal address of the Louvre museum.", _obj({"street": _S, "city": _S, "postal_code": _S,
                                                            "country": _S})),
    ("Plan a one-day Python workshop as an event.",
     _obj({"title": _S, "date": {"type": "string", "format": "date"}, "sessions": _arr(_obj({"time": _S, "topic": _S}),
                                                                                       2, 6)})),
    ("Give a simple pancake recipe.", _obj({"dish": _S, "servings": _I, "ingredients": _arr(_S, 3, 8),
                                            "steps": _arr(_S, 2, 6)})),
    ("Review this code: def add(a, b): return a - b",
     _obj({"verdict": {"enum": ["approve", "request_changes"]},
           "issues": _arr(_obj({"line": _I, "problem": _S}), 1, 3)})),
    ("Specify a REST endpoint that creates a user.",
     _obj({"method": {"enum": ["GET", "POST", "PUT", "DELETE"]}, "path": _S, "request_fields": _arr(_S, 1, 5),
           "status_on_success": _I})),
    ("Explain what this SQL does: SELECT name FROM users WHERE age > 30 ORDER BY name;",
     _obj({"tables": _arr(_S, 1, 3), "filters": _arr(_S, 0, 3), "ordering": _S, "summary": _S})),
    ("List three things to do before a release.", _obj({"todos": _arr(_obj({"task": _S, "done": _B}), 3, 3)})),
    ("Report today's weather in Oslo (make it up).",
     _obj({"city": _S, "temperature_c": _N, "conditions": {"enum": ["sunny", "cloudy", "rain", "snow"]},
           "wind_kph": _N})),
    ("Give the bibliographic record of the book 'Structure and Interpretation of Computer Programs'.",
     _obj({"title": _S, "authors": _arr(_S, 1, 3), "year": _I, "publisher": _S})),
    ("Describe the movie 'Spirited Away'.", _obj({"title": _S, "year": _I, "director": _S,
                                                  "genres": _arr(_S, 1, 3), "rating": _N})),
    ("Book a flight from Paris to Tokyo for one adult (make up the details).",
     _obj({"from": _S, "to": _S, "passengers": _I, "class": {"enum": ["economy", "business", "first"]},
           "flight_number": {"type": "string", "pattern": "^[A-Z]{2}[0-9]{2,4}$"}})),
    ("File a bug report: the login button does nothing on Safari.",
     _obj({"title": _S, "severity": {"enum": ["low", "medium", "high", "critical"]}, "steps": _arr(_S, 1, 5),
           "browser": _S})),
    ("Describe the signature of a Python function that merges two sorted lists.",
     _obj({"name": _S, "parameters": _arr(_obj({"name": _S, "type": _S}), 1, 4), "returns": _S})),
    ("Write a git commit for fixing an off-by-one error in pagination.",
     _obj({"type": {"enum": ["fix", "feat", "docs", "refactor"]}, "scope": _S, "subject": _S, "body": _S})),
    ("Write a unit test case for a function is_even(n).",
     _obj({"test_name": _S, "inputs": _arr(_I, 1, 4), "expected": _arr(_B, 1, 4)})),
    ("Give a web server configuration with port, host and TLS settings.",
     _obj({"host": _S, "port": _I, "tls": _obj({"enabled": _B, "cert_path": _S}), "workers": _I})),
    ("Write an invoice for two hours of consulting at 120 USD per hour.",
     _obj({"invoice_number": _S, "items": _arr(_obj({"description": _S, "quantity": _N, "unit_price": _N}), 1, 3),
           "total": _N, "currency": _S})),
    ("Take notes of a short team meeting about a delayed release.",
     _obj({"attendees": _arr(_S, 2, 5), "decisions": _arr(_S, 1, 3),
           "action_items": _arr(_obj({"owner": _S, "task": _S}), 1, 3)})),
]

STRUCTURED_PROMPTS: list[dict] = [
    {"category": "json", "messages": [{"role": "user", "content": f"{prompt} Answer in JSON."}],
     "response_format": {"type": "json_schema", "json_schema": {"name": f"case_{i}", "schema": schema,
                                                                "strict": True}}}
    for i, (prompt, schema) in enumerate(_CASES)
]


def schema_valid(text: str, response_format: dict) -> bool | None:
    """Does a structured-output answer parse, and validate against its schema? None for response_format text."""
    import jsonschema

    kind = response_format.get("type")
    if kind not in ("json_object", "json_schema"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return False
    if kind == "json_object":
        return isinstance(value, dict)
    try:
        jsonschema.validate(value, response_format["json_schema"]["schema"])
    except jsonschema.ValidationError:
        return False
    return True
