// A chat page on useStream (@langchain/langgraph-sdk/react), built with esbuild by
// tests/test_serve_js.py and driven in Chromium: type, watch the answer stream in,
// approve the refund, see its result.
import React, { useState } from "react";
import { createRoot } from "react-dom/client";
import { useStream } from "@langchain/langgraph-sdk/react";

const params = new URLSearchParams(window.location.search);
// A server with --auth (tests.serve_agents:bearer) takes the identity as a token. One
// object for the page's life: useStream makes a new client when its headers change.
const headers = params.get("token") ? { Authorization: `Bearer ${params.get("token")}` } : undefined;

function text(message) {
  const content = message.content;
  if (typeof content === "string") return content;
  return (content || []).map((block) => block.text || "").join("");
}

function kind(message) {
  return message.type || message.role;
}

function Message({ message }) {
  const who = kind(message);
  const calls = (message.tool_calls || []).map((c) => `${c.name}(${JSON.stringify(c.args)})`);
  return (
    <li className={`message ${who}`} data-kind={who}>
      <b>{who}</b> <span className="text">{text(message)}</span>
      {calls.length > 0 && <code className="calls"> calls {calls.join(", ")}</code>}
    </li>
  );
}

function Approval({ interrupt, onAnswer }) {
  const requests = (interrupt.value && interrupt.value.requests) || [];
  return (
    <div className="approval">
      <p>Waiting for approval:</p>
      <ul>
        {requests.map((r) => (
          <li key={r.call_id} className="request">
            {r.tool} {JSON.stringify(r.args)}
          </li>
        ))}
      </ul>
      <button type="button" onClick={() => onAnswer("approve")}>
        Approve
      </button>{" "}
      <button type="button" onClick={() => onAnswer({ type: "reject", message: "not now" })}>
        Reject
      </button>
    </div>
  );
}

function App() {
  const [threadId, setThreadId] = useState(null);
  const [draft, setDraft] = useState("");
  const stream = useStream({
    apiUrl: params.get("api"),
    assistantId: params.get("assistant") || "support",
    messagesKey: "messages",
    threadId,
    onThreadId: setThreadId,
    defaultHeaders: headers,
  });
  const send = (event) => {
    event.preventDefault();
    stream.submit({ messages: [{ type: "human", content: draft }] });
    setDraft("");
  };
  return (
    <main>
      <h1>Support chat</h1>
      <p className="status">{stream.isLoading ? "streaming…" : "idle"}</p>
      <ul className="messages">
        {stream.messages.map((m, i) => (
          <Message key={m.id || i} message={m} />
        ))}
      </ul>
      {stream.interrupt && (
        <Approval
          interrupt={stream.interrupt}
          onAnswer={(resume) => stream.submit(undefined, { command: { resume } })}
        />
      )}
      {stream.error && <p className="error">{String(stream.error)}</p>}
      <form onSubmit={send}>
        <input
          name="message"
          value={draft}
          onChange={(e) => setDraft(e.target.value)}
          placeholder="Write a message"
        />
        <button type="submit">Send</button>
      </form>
    </main>
  );
}

createRoot(document.getElementById("root")).render(<App />);
