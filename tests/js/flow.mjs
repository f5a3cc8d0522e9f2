// The JavaScript client (@langchain/langgraph-sdk) through the flow tests/test_serve.py
// runs from Python: node flow.mjs URL IDENTITY [URL2] prints one JSON object of what it
// saw. With URL2 (another server process on the same PostgreSQL) the approval is answered,
// the stream rejoined and the run cancelled through it.
import { Client } from "@langchain/langgraph-sdk";

const [url, who, url2] = process.argv.slice(2);
const connect = (apiUrl, identity) =>
  new Client({ apiUrl, apiKey: null, defaultHeaders: { Authorization: `Bearer ${identity}` } });
const client = connect(url, who);
const second = connect(url2 || url, who);
const REFUND = "Order A-1 arrived damaged. Please refund it.";
const out = {};

const collect = async (iterable) => {
  const parts = [];
  for await (const part of iterable) parts.push(part);
  return parts;
};
const texts = (parts) =>
  parts
    .filter((p) => p.event === "custom" && p.data.type === "text")
    .map((p) => p.data.text);

// A streamed run that stops for approval, answered with a Command.
const thread = await client.threads.create({ metadata: { from: "node" } });
const parts = await collect(
  client.runs.stream(thread.thread_id, "support", {
    input: { messages: [{ role: "user", content: REFUND }] },
    streamMode: ["values", "updates", "custom", "messages-tuple"],
  }),
);
out.first_event = parts[0].event;
out.streamed_text = texts(parts).join("");
out.tuple_chunks = parts
  .filter((p) => p.event === "messages" && p.data[0].type === "AIMessageChunk")
  .map((p) => p.data[0].content)
  .join("");
const asked = parts.filter((p) => p.event === "updates" && p.data.__interrupt__);
const request = asked[0].data.__interrupt__[0].value.requests[0];
out.asked_tool = request.tool;
const state = await client.threads.getState(thread.thread_id);
out.next = state.next;
out.status_waiting = (await client.threads.get(thread.thread_id)).status;
const done = await second.runs.wait(thread.thread_id, "support", {
  command: { resume: { [request.call_id]: { type: "approve" } } },
});
out.answer = done.messages[done.messages.length - 1].content;
out.status_done = (await client.threads.get(thread.thread_id)).status;
const history = await second.threads.getHistory(thread.thread_id, { limit: 50 });
out.history_nexts = history.map((h) => h.next);

// A background run followed, dropped after five pieces, and joined again.
const chunky = await client.threads.create();
const run = await client.runs.create(chunky.thread_id, "chunky", {
  input: { messages: [{ role: "user", content: "go" }] },
  streamMode: ["custom"],
});
const first = [];
for await (const part of client.runs.joinStream(chunky.thread_id, run.run_id)) {
  first.push(part);
  if (texts(first).length === 5) break;
}
const rest = await collect(
  second.runs.joinStream(chunky.thread_id, run.run_id, {
    lastEventId: first[first.length - 1].id,
  }),
);
out.rejoined_pieces = texts([...first, ...rest]);
await client.runs.join(chunky.thread_id, run.run_id);
out.rejoined_status = (await client.runs.get(chunky.thread_id, run.run_id)).status;

// A long run cancelled while its tool runs.
const slow = await client.threads.create();
const long = await client.runs.create(slow.thread_id, "slow", {
  input: { messages: [{ role: "user", content: "wait" }] },
  streamMode: ["custom"],
});
for await (const part of client.runs.joinStream(slow.thread_id, long.run_id)) {
  if (part.event === "custom" && part.data.type === "tool_call_started") break;
}
await second.runs.cancel(slow.thread_id, long.run_id, true);
out.cancelled_status = (await client.runs.get(slow.thread_id, long.run_id)).status;

// Another identity sees none of it.
const other = connect(url2 || url, `${who}-other`);
try {
  await other.threads.get(thread.thread_id);
  out.other_status = 200;
} catch (err) {
  out.other_status = err.status;
}
out.other_search = (await other.threads.search({ metadata: { from: "node" } })).length;

console.log(JSON.stringify(out));
