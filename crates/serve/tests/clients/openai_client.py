"""OpenAI's own Python client against a running `serve`, unchanged but for base_url.

Usage: openai_client.py BASE_URL API_KEY MODEL. Prints one JSON object with what each call
gave; the Rust test (tests/api.rs) checks it against generate's text.
"""

import json
import sys

import openai

base_url, key, model = sys.argv[1:4]
client = openai.OpenAI(base_url=base_url + "/v1", api_key=key, max_retries=0)
out = {}

out["models"] = [m.id for m in client.models.list()]

whole = client.completions.create(
    model=model, prompt="ROMEO:", max_tokens=30, temperature=0.8, top_p=1, seed=7, n=2,
    extra_body={"top_k": 20},
)
out["whole"] = {
    "texts": [c.text for c in sorted(whole.choices, key=lambda c: c.index)],
    "finish": [c.finish_reason for c in whole.choices],
    "usage": whole.usage.model_dump(),
    "object": whole.object,
}

texts = ["", ""]
finish = [None, None]
usage = None
for chunk in client.completions.create(
    model=model, prompt="ROMEO:", max_tokens=30, temperature=0.8, seed=7, n=2, stream=True,
    stream_options={"include_usage": True}, extra_body={"top_k": 20},
):
    for c in chunk.choices:
        texts[c.index] += c.text
        if c.finish_reason:
            finish[c.index] = c.finish_reason
    if chunk.usage:
        usage = chunk.usage.model_dump()
out["streamed"] = {"texts": texts, "finish": finish, "usage": usage}


def error(call):
    try:
        call()
    except openai.APIStatusError as e:
        return {"class": type(e).__name__, "status": e.status_code, "param": e.body.get("param"),
                "code": e.body.get("code")}
    return None


out["unknown_model"] = error(lambda: client.completions.create(model="nope", prompt="a"))
out["bad_max_tokens"] = error(
    lambda: client.completions.create(model=model, prompt="a", max_tokens=0))
wrong_key = openai.OpenAI(base_url=base_url + "/v1", api_key="wrong", max_retries=0)
out["wrong_key"] = error(lambda: wrong_key.models.list())

print(json.dumps(out))
