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

# Log-probabilities, whole and streamed (the same seed: the same tokens).
logprobs = {}
whole = client.completions.create(
    model=model, prompt="ROMEO:", max_tokens=20, temperature=0.8, seed=3, logprobs=3)
lp = whole.choices[0].logprobs
logprobs["whole"] = {"text": whole.choices[0].text, "tokens": lp.tokens,
                     "token_logprobs": lp.token_logprobs, "top_logprobs": lp.top_logprobs,
                     "text_offset": lp.text_offset}
streamed = {"text": "", "tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
for chunk in client.completions.create(
    model=model, prompt="ROMEO:", max_tokens=20, temperature=0.8, seed=3, logprobs=3,
    stream=True,
):
    for c in chunk.choices:
        streamed["text"] += c.text
        if c.logprobs:
            for field in ["tokens", "token_logprobs", "top_logprobs", "text_offset"]:
                streamed[field] += getattr(c.logprobs, field)
logprobs["streamed"] = streamed
scored = client.completions.create(
    model=model, prompt="ROMEO: my", max_tokens=0, echo=True, logprobs=0)
logprobs["scored"] = {"text": scored.choices[0].text,
                      "token_logprobs": scored.choices[0].logprobs.token_logprobs}
out["logprobs"] = logprobs


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
