// The inbox's page script: on an automation's page, follows its events live. It reads the
// NDJSON events route with fetch and a stream reader (the session cookie authenticates the
// request), lists each event, and updates the status and the result when the automation ends.
// Values from scripts reach the page only as text (textContent), never as HTML.
(function () {
  'use strict';

  const list = document.getElementById('events');
  if (!list || !list.dataset.src) return;
  const live = document.getElementById('live');
  const status = document.getElementById('status');
  // Rounds the server already showed: a later approval request needs a reload to be decided.
  const shownRounds = Number(list.dataset.rounds || '0');

  function element(tag, content, className) {
    const el = document.createElement(tag);
    el.textContent = content;
    if (className) el.className = className;
    return el;
  }

  function say(message) {
    if (live) live.textContent = message;
  }

  function setStatus(value) {
    if (!status) return;
    status.textContent = value;
    status.dataset.status = value;
  }

  function describe(event) {
    switch (event.type) {
      case 'approval_requested':
        return 'round ' + event.round + ': approval requested for ' +
          (event.pending || []).map((p) => p.function + ' ' + JSON.stringify(p.request)).join(', ');
      case 'decided':
        return 'round ' + event.round + ': decided by ' + event.actor + ': ' +
          (event.decisions || []).map((d) => d.interruptionId + (d.approved ? ' approved' : ' rejected') +
            (d.reason ? ' (' + d.reason + ')' : '')).join(', ');
      case 'completed':
        return 'with ' + JSON.stringify(event.value);
      case 'failed':
        return event.code + ': ' + event.message;
      default:
        return JSON.stringify(event);
    }
  }

  function showOutcome(event) {
    const outcome = document.getElementById('outcome');
    // The server rendered the outcome already when the page was loaded after the end.
    if (!outcome || document.getElementById('result') || document.getElementById('error')) return;
    outcome.replaceChildren();
    if (event.type === 'completed') {
      const result = element('pre', JSON.stringify(event.value, null, 2));
      result.id = 'result';
      outcome.append(element('h2', 'Result'), result);
    } else {
      const error = document.createElement('p');
      error.id = 'error';
      error.append(element('code', String(event.code)), document.createTextNode(' ' + event.message));
      outcome.append(element('h2', 'Error'), error);
    }
  }

  // Handles one NDJSON line; true when it ends the automation.
  function handle(line) {
    if (!line.trim()) return false;
    let entry;
    try {
      entry = JSON.parse(line);
    } catch (_) {
      return false;
    }
    const event = entry.event || {};
    const item = document.createElement('li');
    item.dataset.type = String(event.type);
    item.append(element('span', '#' + entry.index + ' ', 'muted'), element('strong', String(event.type)),
      document.createTextNode(' ' + describe(event)));
    for (const c of event.console || []) item.append(element('div', '[' + c.level + '] ' + c.text, 'console'));
    list.append(item);
    switch (event.type) {
      case 'completed':
      case 'failed':
        setStatus(event.type);
        showOutcome(event);
        return true;
      case 'decided': {
        const slot = document.getElementById('round-' + event.round + '-decision');
        if (slot) slot.textContent = describe(event).replace(/^round \d+: d/, 'D');
        if (event.round >= shownRounds) {
          setStatus('running');
          const pending = document.getElementById('pending');
          if (pending) pending.replaceChildren(element('p', 'Decided; the automation continues.', 'muted'));
        }
        return false;
      }
      case 'approval_requested':
        if (event.round > shownRounds) {
          setStatus('waiting');
          say('A new approval is waiting: reload the page to decide it.');
        }
        return false;
      default:
        return false;
    }
  }

  async function follow() {
    say('Following events live…');
    let ended = false;
    try {
      const response = await fetch(list.dataset.src, {
        credentials: 'same-origin',
        headers: { Accept: 'application/x-ndjson' },
      });
      if (!response.ok || !response.body) {
        say('Live updates are unavailable (HTTP ' + response.status + '); reload the page.');
        return;
      }
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let at;
        while ((at = buffer.indexOf('\n')) >= 0) {
          ended = handle(buffer.slice(0, at)) || ended;
          buffer = buffer.slice(at + 1);
        }
      }
      ended = handle(buffer + decoder.decode()) || ended;
    } catch (_) {
      // Reported below.
    }
    say(ended ? 'The automation has ended.' : 'Live updates stopped; reload the page to see new events.');
  }

  follow();
})();
