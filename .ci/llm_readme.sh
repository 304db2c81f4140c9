#!/usr/bin/env bash
# The README's LLM commands as a new user runs them, on a random small Qwen3 checkpoint (no
# download): `gear-runtime llm build`, `gear-runtime serve`, one call with the `openai` client
# and one with curl. Needs the llm-build extra (and torch) in the active environment.
set -euo pipefail
work="$(mktemp -d)"
server=""
trap '{ [ -n "$server" ] && kill "$server"; } 2>/dev/null; rm -rf "$work"' EXIT
python -c "import sys; from gear_runtime.examples.hf_qwen3 import write_random_qwen3;
write_random_qwen3(sys.argv[1])" "$work/Qwen3-tiny"
gear-runtime llm build "$work/Qwen3-tiny" -o "$work/qwen3"
GEAR_RUNTIME_LLM_CACHE="$work/cache" gear-runtime serve "$work/qwen3" --port 0 \
    > "$work/serve.out" 2>&1 &
server=$!
for _ in $(seq 600); do
    grep -q "serving" "$work/serve.out" && break
    kill -0 "$server" || { cat "$work/serve.out"; exit 1; }
    sleep 0.1
done
port="$(grep -o 'http://127.0.0.1:[0-9]*' "$work/serve.out" | head -1 | cut -d: -f3)"
python - "$port" <<'PY'
import sys

import openai

client = openai.OpenAI(base_url=f"http://127.0.0.1:{sys.argv[1]}/v1", api_key="none")
out = client.chat.completions.create(model="qwen3", max_tokens=8,
                                     messages=[{"role": "user", "content": "Hello"}])
assert out.usage.completion_tokens >= 1, out
print("openai:", repr(out.choices[0].message.content), out.usage)
PY
curl -sf "http://127.0.0.1:$port/v1/completions" \
    -d '{"model": "qwen3", "prompt": "Hello", "max_tokens": 16}' | python -m json.tool
kill -TERM "$server"
status=0; wait "$server" || status=$?
server=""
cat "$work/serve.out"
exit "$status"
