// The page `klein serve` shows at /: a form over the routes the server already has (txt2img,
// or the OpenAI edits route when reference images are chosen; progress with its preview;
// interrupt). Query parameters fill the form (prompt, negative, width, height, steps, seed,
// guidance) and run=1 starts it, so a link can reproduce an image. No external URLs.
#include "server/page.h"

namespace klein {

const char* const kServerPage = R"html(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Klein Edge</title>
<style>
  body { font: 15px/1.4 system-ui, sans-serif; margin: 0 auto; max-width: 980px; padding: 1em; color: #222; }
  h1 { font-size: 1.3em; margin: 0 0 .6em; }
  form { display: grid; grid-template-columns: 8em 1fr; gap: .4em .8em; align-items: center; }
  textarea { width: 100%; min-height: 4em; }
  .row { display: flex; gap: .6em; flex-wrap: wrap; }
  .row input { width: 6em; }
  #status { margin: .8em 0; min-height: 1.4em; }
  progress { width: 100%; }
  #images { display: flex; gap: 1em; flex-wrap: wrap; margin-top: 1em; }
  #images img, #preview { max-width: 100%; image-rendering: pixelated; border: 1px solid #ccc; }
  #preview { width: 256px; }
  .error { color: #b00020; }
</style>
</head>
<body>
<h1>Klein Edge</h1>
<form id="form">
  <label for="prompt">Prompt</label>
  <textarea id="prompt" required></textarea>
  <label for="negative">Negative</label>
  <input id="negative" placeholder="(klein-base only)">
  <label>Size, steps</label>
  <div class="row">
    <input id="width" type="number" min="16" step="16" value="512" title="width">
    <input id="height" type="number" min="16" step="16" value="512" title="height">
    <input id="steps" type="number" min="1" placeholder="default" title="steps">
    <input id="seed" type="number" min="-1" value="-1" title="seed (-1: random)">
    <input id="guidance" type="number" min="0" step="0.1" placeholder="default" title="guidance">
  </div>
  <label for="refs">References</label>
  <input id="refs" type="file" accept="image/png,image/jpeg" multiple
         title="images to edit from (the output takes the first one's size unless width/height are set)">
  <label for="key">API key</label>
  <input id="key" type="password" placeholder="if the server asks for one">
  <span></span>
  <div class="row"><button id="go" type="submit">Generate</button>
    <button id="stop" type="button" disabled>Cancel</button></div>
</form>
<div id="status"></div>
<progress id="bar" max="1" value="0" hidden></progress>
<img id="preview" alt="preview" hidden>
<div id="images"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const fields = ["prompt", "negative", "width", "height", "steps", "seed", "guidance"];
const headers = () => {
  const h = { "Content-Type": "application/json" };
  if ($("key").value) h.Authorization = "Bearer " + $("key").value;
  return h;
};
function setStatus(text, error) {
  $("status").textContent = text;
  $("status").className = error ? "error" : "";
}
async function poll(state) {
  while (state.running) {
    try {
      const r = await fetch("/sdapi/v1/progress", { headers: headers() });
      if (r.ok) {
        const p = await r.json();
        if (state.running && p.state && p.state.sampling_steps) {
          $("bar").hidden = false;
          $("bar").value = p.progress;
          setStatus("step " + p.state.sampling_step + " of " + p.state.sampling_steps +
                    (p.eta_relative > 0 ? ", about " + Math.round(p.eta_relative) + " s left" : ""));
        }
        if (state.running && p.current_image) {
          $("preview").src = "data:image/png;base64," + p.current_image;
          $("preview").hidden = false;
        }
      }
    } catch (e) { /* the next poll tries again */ }
    await new Promise((done) => setTimeout(done, 400));
  }
}
// Text to image through txt2img; with reference files, editing through the OpenAI edits
// route (multipart). Either way: [base64 PNGs], seed, width, height, steps.
async function request() {
  const refs = $("refs").files;
  const seed = Number($("seed").value);
  if (refs.length === 0) {
    const body = { prompt: $("prompt").value, negative_prompt: $("negative").value,
                   width: Number($("width").value), height: Number($("height").value), seed };
    if ($("steps").value) body.steps = Number($("steps").value);
    if ($("guidance").value) body.cfg_scale = Number($("guidance").value);
    const r = await fetch("/sdapi/v1/txt2img", { method: "POST", headers: headers(),
                                                  body: JSON.stringify(body) });
    const reply = await r.json();
    if (!r.ok) throw new Error(reply.detail || reply.error || r.statusText);
    const info = JSON.parse(reply.info);
    return { images: reply.images, seed: info.seed, width: info.width, height: info.height,
             steps: info.steps };
  }
  const form = new FormData();
  form.append("prompt", $("prompt").value);
  if ($("negative").value) form.append("negative_prompt", $("negative").value);
  if ($("width").value && $("height").value)
    form.append("size", $("width").value + "x" + $("height").value);
  if ($("steps").value) form.append("steps", $("steps").value);
  if ($("guidance").value) form.append("guidance", $("guidance").value);
  if (seed >= 0) form.append("seed", String(seed));
  for (const f of refs) form.append("image[]", f, f.name);
  const h = headers();
  delete h["Content-Type"];  // the browser sets the multipart boundary
  const r = await fetch("/v1/images/edits", { method: "POST", headers: h, body: form });
  const reply = await r.json();
  if (!r.ok) throw new Error((reply.error && reply.error.message) || r.statusText);
  const first = atob(reply.data[0].b64_json);
  // The PNG header holds the size: width and height at bytes 16..23, big-endian.
  const word = (at) => [0, 1, 2, 3].reduce((v, i) => v * 256 + first.charCodeAt(at + i), 0);
  return { images: reply.data.map((d) => d.b64_json), seed: reply.data[0].seed,
           width: word(16), height: word(20), steps: $("steps").value || "default" };
}
async function generate() {
  const state = { running: true };
  $("go").disabled = true;
  $("stop").disabled = false;
  $("images").replaceChildren();
  setStatus("waiting for the model...");
  const polling = poll(state);
  const started = performance.now();
  try {
    const info = await request();
    for (const png of info.images) {
      const img = document.createElement("img");
      img.className = "result";
      img.src = "data:image/png;base64," + png;
      $("images").append(img);
    }
    setStatus("seed " + info.seed + ", " + info.width + "x" + info.height + ", " + info.steps +
              " steps, " + ((performance.now() - started) / 1000).toFixed(1) + " s");
    document.body.dataset.done = "ok";
  } catch (e) {
    setStatus(e.message, true);
    document.body.dataset.done = "error";
  } finally {
    state.running = false;
    await polling;
    $("bar").hidden = true;
    $("preview").hidden = true;
    $("go").disabled = false;
    $("stop").disabled = true;
  }
}
$("form").addEventListener("submit", (e) => { e.preventDefault(); generate(); });
$("stop").addEventListener("click", () =>
  fetch("/sdapi/v1/interrupt", { method: "POST", headers: headers() }));
const query = new URLSearchParams(location.search);
for (const f of fields) if (query.has(f)) $(f).value = query.get(f);
if (query.get("run") === "1") generate();
</script>
</body>
</html>
)html";

}  // namespace klein
