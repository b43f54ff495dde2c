// Token ids of the official JavaScript implementation of tokenizer.json
// (@huggingface/tokenizers) for the strings and rendered chat prompts given as JSON on stdin:
//   node encode.mjs tokenizer.json tokenizer_config.json < {"strings": [...], "prompts": [...]}
// Writes {"implementation", "strings": [{text, ids, tokens, decoded}], "prompts": [{ids, tokens}]}.
// Nothing is added around the text (add_special_tokens false, as the chat-template path of
// transformers tokenizes a prompt that already starts with the BOS token).
import { readFileSync } from "node:fs";
import { Tokenizer } from "@huggingface/tokenizers";

const [tokenizerPath, configPath] = process.argv.slice(2);
const tokenizer = new Tokenizer(JSON.parse(readFileSync(tokenizerPath, "utf8")),
                                JSON.parse(readFileSync(configPath, "utf8")));
const request = JSON.parse(readFileSync(0, "utf8"));
const version = JSON.parse(readFileSync(
    new URL("./node_modules/@huggingface/tokenizers/package.json", import.meta.url), "utf8")).version;

const encode = (text) => {
  const e = tokenizer.encode(text, { add_special_tokens: false });
  return { ids: e.ids, tokens: e.tokens };
};
const result = {
  implementation: `@huggingface/tokenizers ${version}`,
  strings: request.strings.map((text) => {
    const e = encode(text);
    return { text, ...e, // (decode refuses an empty list: nothing decodes to "")
      decoded: e.ids.length ? tokenizer.decode(e.ids, { clean_up_tokenization_spaces: false }) : "", };
  }),
  prompts: request.prompts.map(encode),
};
process.stdout.write(JSON.stringify(result));
