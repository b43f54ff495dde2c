// The page `klein serve` shows at /: a form over the routes the server already has (txt2img,
// or the OpenAI edits route when reference images are chosen; progress with its preview;
// interrupt). It shows the fields the model takes (GET /health's "accepts": references and a
// negative prompt for FLUX.2-klein, the two CFG options for Z-Image). Query parameters fill
// the form (prompt, negative, width, height, steps, seed, guidance, cfg_normalization,
// cfg_truncation) and run=1 starts it, so a link can reproduce an image. Each result shows the seed
// that made it, a button that puts that seed in the form, and a link that saves the server's
// PNG as it came (with its metadata). Seeds stay strings on the page: a user's seed may be any
// 64-bit value, which a JavaScript number would round. No external URLs.
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
  [hidden] { display: none !important; }
  input, textarea, button { font: inherit; }
  form { display: grid; grid-template-columns: max-content 1fr; gap: .5em 1em; align-items: center; }
  textarea { width: 100%; min-height: 4em; box-sizing: border-box; }
  #negative { width: 100%; box-sizing: border-box; }
  .row { display: flex; gap: .4em .8em; flex-wrap: wrap; align-items: flex-end; }
  .field { display: flex; flex-direction: column; }
  .field label { font-size: .9em; }
  .field input { width: 6em; }
  .field #seed { width: 13em; }
  .hint { color: #666; font-size: .85em; }
  #status { margin: .8em 0; min-height: 1.4em; }
  progress { width: 100%; }
  #images { display: flex; gap: 1em; flex-wrap: wrap; margin-top: 1em; }
  figure { margin: 0; min-width: 0; max-width: 100%; }
  figure img, #preview { display: block; max-width: 100%; image-rendering: pixelated; border: 1px solid #ccc; }
  figure img { min-width: 256px; }
  figcaption { display: flex; gap: .6em; align-items: center; flex-wrap: wrap; margin-top: .4em; }
  #preview { width: 256px; }
  .error { color: #b00020; }
</style>
</head>
<body>
<h1>Klein Edge <span id="model" class="hint"></span></h1>
<form id="form">
  <label for="prompt">Prompt</label>
  <textarea id="prompt" placeholder="empty: an unconditional image"></textarea>
  <label for="negative" class="negative-row">Negative prompt</label>
  <input id="negative" class="negative-row" placeholder="what to avoid (with guidance)">
  <span>Settings</span>
  <div class="row">
    <div class="field"><label for="width">Width</label>
      <input id="width" type="number" min="16" step="16" value="512"></div>
    <div class="field"><label for="height">Height</label>
      <input id="height" type="number" min="16" step="16" value="512"></div>
    <div class="field"><label for="steps">Steps</label>
      <input id="steps" type="number" min="1" placeholder="default"></div>
    <div class="field"><label for="seed">Seed <span class="hint">(empty or -1: random)</span></label>
      <input id="seed" type="text" inputmode="numeric" pattern="-1|[0-9]{1,20}" placeholder="random"
             autocomplete="off"></div>
    <div class="field"><label for="guidance">Guidance</label>
      <input id="guidance" type="number" min="0" step="0.1" placeholder="default"></div>
  </div>
  <span class="cfg-row" hidden>Guidance options</span>
  <div class="row cfg-row" hidden>
    <div class="field"><label for="cfg_normalization">CFG normalization
      <span class="hint">(0: off)</span></label>
      <input id="cfg_normalization" type="number" min="0" step="0.1" placeholder="off"
             title="scale the guided prediction back to this multiple of the unguided one's length when it is longer"></div>
    <div class="field"><label for="cfg_truncation">CFG truncation</label>
      <input id="cfg_truncation" type="number" step="0.05" placeholder="1"
             title="steps whose model time (0 at noise, 1 at the image) is above this run unguided"></div>
  </div>
  <label for="refs" class="refs-row">References</label>
  <input id="refs" class="refs-row" type="file" accept="image/png,image/jpeg" multiple
         title="images to edit from (the output takes the first one's size unless width/height are set)">
  <label for="key">API key</label>
  <input id="key" type="password" placeholder="if the server asks for one">
  <span></span>
  <div class="row"><button id="go" type="submit">Generate</button>
    <button id="stop" type="button" disabled>Cancel</button></div>
</form>
<div id="status"></div>
<progress id="bar" max="1" value="0" hidden></progress>
<img id="preview" alt="step preview" hidden>
<div id="images"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const fields = ["prompt", "negative", "width", "height", "steps", "seed", "guidance",
                "cfg_normalization", "cfg_truncation"];
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
// The seed field as the digits to send, or "" for a random seed. The digits go into the
// request as they are: Number() would round a seed above 2^53.
function seedText() {
  const text = $("seed").value.trim();
  if (text === "" || text === "-1") return "";
  if (!/^[0-9]{1,20}$/.test(text))
    throw new Error("seed: a whole number from 0 to 18446744073709551615, or empty for a random one");
  return text;
}
// Text to image through txt2img; with reference files, editing through the OpenAI edits
// route (multipart). Either way: [base64 PNGs], [seeds as strings], width, height, steps.
async function request() {
  const refs = $("refs").files;
  const seed = seedText();
  if (refs.length === 0) {
    const body = { prompt: $("prompt").value, negative_prompt: $("negative").value,
                   width: Number($("width").value), height: Number($("height").value) };
    if ($("steps").value) body.steps = Number($("steps").value);
    if ($("guidance").value) body.cfg_scale = Number($("guidance").value);
    for (const k of ["cfg_normalization", "cfg_truncation"])
      if ($(k).value) body[k] = Number($(k).value);
    let text = JSON.stringify(body);
    if (seed) text = text.slice(0, -1) + ',"seed":' + seed + "}";
    const r = await fetch("/sdapi/v1/txt2img", { method: "POST", headers: headers(), body: text });
    const reply = await r.json();
    if (!r.ok) throw new Error(reply.detail || reply.error || r.statusText);
    const info = JSON.parse(reply.info);
    return { images: reply.images, seeds: info.all_seeds_str, width: info.width,
             height: info.height, steps: info.steps };
  }
  const form = new FormData();
  form.append("prompt", $("prompt").value);
  if ($("negative").value) form.append("negative_prompt", $("negative").value);
  if ($("width").value && $("height").value)
    form.append("size", $("width").value + "x" + $("height").value);
  if ($("steps").value) form.append("steps", $("steps").value);
  if ($("guidance").value) form.append("guidance", $("guidance").value);
  if (seed) form.append("seed", seed);
  for (const f of refs) form.append("image[]", f, f.name);
  const h = headers();
  delete h["Content-Type"];  // the browser sets the multipart boundary
  const r = await fetch("/v1/images/edits", { method: "POST", headers: h, body: form });
  const reply = await r.json();
  if (!r.ok) throw new Error((reply.error && reply.error.message) || r.statusText);
  const first = atob(reply.data[0].b64_json);
  // The PNG header holds the size: width and height at bytes 16..23, big-endian.
  const word = (at) => [0, 1, 2, 3].reduce((v, i) => v * 256 + first.charCodeAt(at + i), 0);
  return { images: reply.data.map((d) => d.b64_json), seeds: reply.data.map((d) => d.seed_str),
           width: word(16), height: word(20), steps: $("steps").value || "default" };
}
// One result: the image, its seed, a button that puts the seed in the form and a link that
// saves the PNG exactly as the server sent it (a blob of its bytes, metadata included).
let blobs = [];
function showResult(png, seed) {
  const bytes = Uint8Array.from(atob(png), (c) => c.charCodeAt(0));
  const url = URL.createObjectURL(new Blob([bytes], { type: "image/png" }));
  blobs.push(url);
  const figure = document.createElement("figure");
  figure.className = "result";
  const img = document.createElement("img");
  img.src = url;
  img.alt = "image of seed " + seed;
  const caption = document.createElement("figcaption");
  const label = document.createElement("span");
  label.append("Seed ");
  const value = document.createElement("output");
  value.className = "seed";
  value.textContent = seed;
  label.append(value);
  const reuse = document.createElement("button");
  reuse.type = "button";
  reuse.className = "reuse";
  reuse.textContent = "Reuse seed";
  reuse.title = "put " + seed + " in the seed field";
  reuse.addEventListener("click", () => { $("seed").value = seed; $("seed").focus(); });
  const save = document.createElement("a");
  save.className = "download";
  save.href = url;
  save.download = "klein-" + seed + ".png";
  save.textContent = "Download PNG";
  save.title = "the PNG as the server made it, with the prompt and settings in its metadata";
  caption.append(label, reuse, save);
  figure.append(img, caption);
  $("images").append(figure);
}
async function generate() {
  const state = { running: true };
  $("go").disabled = true;
  $("stop").disabled = false;
  $("images").replaceChildren();
  delete document.body.dataset.done;
  for (const url of blobs) URL.revokeObjectURL(url);
  blobs = [];
  setStatus("waiting for the model...");
  const polling = poll(state);
  const started = performance.now();
  try {
    const info = await request();
    info.images.forEach((png, i) => showResult(png, info.seeds[i]));
    setStatus((info.seeds.length > 1 ? "seeds " + info.seeds.join(", ") : "seed " + info.seeds[0]) +
              ", " + info.width + "x" + info.height + ", " + info.steps + " steps, " +
              ((performance.now() - started) / 1000).toFixed(1) + " s");
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
// Show the fields this model takes (GET /health says which), hide the others.
async function showModel() {
  try {
    const r = await fetch("/health");
    const h = await r.json();
    if (!r.ok || !h.accepts) {
      $("model").textContent = h.status === "loading" ? "(the model is loading)" : "";
      if (h.status === "loading") setTimeout(showModel, 1000);
      return;
    }
    $("model").textContent = h.model + " (" + h.family + ")";
    const show = (cls, on) => document.querySelectorAll("." + cls).forEach((e) => { e.hidden = !on; });
    show("negative-row", h.accepts.negative_prompt);
    show("refs-row", h.accepts.references);
    show("cfg-row", h.accepts.cfg_normalization);
    document.body.dataset.model = h.family;
  } catch (e) { /* the form still works with every field */ }
}
showModel();
const query = new URLSearchParams(location.search);
for (const f of fields) if (query.has(f)) $(f).value = query.get(f);
if (query.get("run") === "1") generate();
</script>
</body>
</html>
)html";

}  // namespace klein
