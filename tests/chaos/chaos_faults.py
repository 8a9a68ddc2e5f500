"""The fault driver of the chaos test (chaos_test.py): one method per fault kind, drawn at random
from --faults while traffic runs. A mixin of chaos_test.Chaos, whose state it uses (the instances,
the fault counts, the fault RNG, violation())."""

import http.client
import json
import random
import signal
import threading
import time

from kvpush_harness import body_for, log, send, short, tail


class FaultDriver:
    """Needs from the class it is mixed into: a (arguments), P, D, pd, colo, instances, pool, netns,
    router, fault_flag, faults (counts), counts_lock, streams_in_flight (request ids),
    traffic_done (threading.Event), watchdog_ms, count(), violation(), judge()."""

    def restart(self, inst):
        inst.kill()
        inst.start()
        if not inst.wait_healthy(60):
            self.violation("%s did not come back after a restart: %s" % (
                inst.name, tail(inst.incarnations[-1]["log"])))

    def orphan_pull_legs(self, p, n):
        """P legs of pull requests never followed by a D leg: P leases the blocks until lease_ms."""
        for _ in range(n):
            e = self.pool[self.frng.randrange(len(self.pool))]
            b = body_for(e, False)
            b["max_tokens"] = 1
            b["kv_transfer_params"] = {"do_remote_decode": True, "do_remote_prefill": False,
                                       "transfer_mode": "pull",
                                       "transfer_id": "%032x" % self.frng.getrandbits(128)}
            r = send(p.host, p.port, b, timeout=10)
            self.count(self.faults, "lease left to expire (orphan pull P leg, %s)" % (
                "answered" if r["kind"] == "ok" else "refused: " + r["kind"]))

    def stop_for(self, inst, pause):
        inst.proc.send_signal(signal.SIGSTOP)
        time.sleep(pause)
        inst.proc.send_signal(signal.SIGCONT)

    # -- one method per fault kind ---------------------------------------------------------------

    def fault_kill_restart(self, kind):
        inst = self.frng.choice(self.P if kind.endswith("P") else self.D)
        inst.scrape()
        self.count(self.faults, "SIGKILL + restart on the same port (%s)" % inst.name[0])
        log("fault: SIGKILL %s, restart on port %d" % (inst.name, inst.port))
        self.restart(inst)

    def fault_sigstop(self, kind):
        inst = self.frng.choice(self.pd if kind == "sigstop" else
                                self.P if kind.endswith("P") else self.D)
        pause = (self.watchdog_ms + self.frng.randrange(300, 2000)) / 1000.0
        self.count(self.faults, "SIGSTOP past the watchdog (%s)" % inst.name[0])
        log("fault: SIGSTOP %s for %.1f s" % (inst.name, pause))
        self.stop_for(inst, pause)

    def fault_restart_stopped(self, _kind):
        """A new P incarnation stopped as soon as it answers /health: the Ds must handshake with
        it again, and legs naming it must not queue behind that handshake (issue 26 item 1)."""
        inst = self.frng.choice(self.P)
        delay = self.frng.uniform(0.0, 1.2)  # around the router's 1 s health interval
        pause = (self.watchdog_ms + self.frng.randrange(300, 2000)) / 1000.0
        self.count(self.faults, "restarted, stopped before any handshake (P)")
        log("fault: SIGKILL %s, restart, SIGSTOP %.1f s after it is healthy, for %.1f s" % (
            inst.name, delay, pause))
        inst.scrape()
        self.restart(inst)
        time.sleep(delay)
        self.stop_for(inst, pause)

    def fault_orphan_leases(self, _kind):
        p = self.frng.choice(self.P)
        n = self.frng.randrange(2, 8)
        log("fault: %d pull P legs to %s left to expire" % (n, p.name))
        self.orphan_pull_legs(p, n)

    def fault_broken(self, _kind):
        if not self.fault_flag:
            return
        inst = self.frng.choice(self.P)
        hold = self.frng.uniform(1.0, 5.0)
        self.count(self.faults, "broken but alive: every transfer post fails (P)")
        log("fault: %s broken (every post fails) for %.1f s" % (inst.name, hold))
        inst.proc.send_signal(signal.SIGUSR1)
        time.sleep(hold)
        inst.proc.send_signal(signal.SIGUSR2)

    def fault_link_cut(self, _kind):
        i = self.frng.randrange(len(self.pd))
        down = self.frng.uniform(0.5, 3.0)
        self.count(self.faults, "link cut (veth down/up, %s)" % self.pd[i].name[0])
        log("fault: link of %s down for %.1f s" % (self.pd[i].name, down))
        self.netns.set_link(i, False)
        time.sleep(down)
        self.netns.set_link(i, True)

    def fault_migrate(self, _kind):
        """An operator moves a stream in flight to another D (POST /admin/migrate, issue 24);
        the stream's answer is checked as any other (identical to colocated, or an explicit
        error)."""
        with self.counts_lock:
            ids = sorted(self.streams_in_flight)
        if not ids:
            self.count(self.faults, "POST /admin/migrate: no stream in flight")
            return
        rid = self.frng.choice(ids)
        try:
            c = http.client.HTTPConnection(self.router.host, self.router.port, timeout=40)
            c.request("POST", "/admin/migrate", json.dumps({"request_id": rid}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            body = r.read().decode("utf-8", "replace")
            c.close()
        except (OSError, http.client.HTTPException) as e:
            self.violation("POST /admin/migrate %s: no answer (%s)" % (rid, e))
            return
        self.count(self.faults, "POST /admin/migrate -> %d" % r.status)
        log("fault: POST /admin/migrate %s -> %d %s" % (rid, r.status, body[:160]))
        if r.status not in (200, 404, 409, 504):
            self.violation("POST /admin/migrate %s: %d %s" % (rid, r.status, body[:300]))

    LONG_STREAM_TOKENS = 160

    def own_long_stream(self):
        """A long seeded stream of the fault's own: (pool entry, body, colocated token ids,
        mode, request id), or None (a violation recorded) when colocated could not answer it."""
        # A prompt that leaves room for the long answer in the model's 512-token context.
        fits = [i for i, e in enumerate(self.pool)
                if len(e["prompt"]) + self.LONG_STREAM_TOKENS <= 480]
        entry = self.frng.choice(fits)
        body = body_for(self.pool[entry], True)
        body.update({"max_tokens": self.LONG_STREAM_TOKENS, "temperature": 0.8, "top_p": 0.95,
                     "seed": self.frng.randrange(1 << 30)})
        mode = self.frng.choice(self.a.modes.split(","))
        ref = send(self.colo.host, self.colo.port, dict(body, stream=False))
        if ref["kind"] != "ok":
            self.violation("colocated reference of a long stream failed: %s %s" % (
                ref["kind"], ref["error"]))
            return None
        return entry, body, ref["ids"], mode, "chaos-move-%016x" % self.frng.getrandbits(64)

    def ask_move(self, rid):
        """POST /admin/migrate for `rid` on the router: (status, body); status 0 without one."""
        try:
            c = http.client.HTTPConnection(self.router.host, self.router.port, timeout=40)
            c.request("POST", "/admin/migrate", json.dumps({"request_id": rid}),
                      {"Content-Type": "application/json"})
            r = c.getresponse()
            out = r.status, r.read().decode("utf-8", "replace")
            c.close()
            return out
        except (OSError, http.client.HTTPException) as e:
            return 0, str(e)

    def stream_asking(self, body, mode, rid, at, ask):
        """Streams `body` through the router as request `rid` in `mode`, calling `ask` on a
        thread of its own once `at` data events arrived; send()'s answer, once both ended."""
        asker = threading.Thread(target=ask)

        def on_event(n):
            if n == at:
                asker.start()

        r = send(self.router.host, self.router.port, body,
                 headers={"x-kvpush-mode": mode, "x-request-id": rid}, on_event=on_event)
        if asker.ident is not None:  # started
            asker.join()
        return r

    def must_finish(self, what, r, ref, entry):
        """Judges `r` as any answer, and, the other D being healthy, an error is a violation
        too: no stream is cut while a healthy decode instance remains (issue 49)."""
        self.judge(what, r, ref, entry)
        if r["kind"] != "ok":
            self.violation("%s: %s (%s) while another decode instance was healthy" % (
                what, r["kind"], short(r["error"])))

    def fault_move_then_kill(self, _kind):
        """A long stream of its own moved mid-stream (POST /admin/migrate) from D_a to D_b, then
        D_b SIGKILLed (restarted after): the stream goes on on D_a, which it only moved away
        from (docs/router.md, *Moves and failures*)."""
        own = self.own_long_stream()
        if own is None:
            return
        entry, body, ref, mode, rid = own
        at = self.frng.randrange(8, 40)
        asked = {}

        def ask():
            asked["status"], asked["body"] = self.ask_move(rid)
            if asked["status"] != 200:
                return
            to = json.loads(asked["body"]).get("to")
            for d in self.D:
                if d.url == to:
                    time.sleep(self.frng.uniform(0.0, 0.05))
                    d.scrape()
                    d.kill()
                    asked["killed"] = d

        r = self.stream_asking(body, mode, rid, at, ask)
        killed = asked.get("killed")
        what = "long stream %s (%s), moved after %d events -> %s%s" % (
            rid, mode, at, asked.get("status"), ", then its new D SIGKILLed" if killed else "")
        self.count(self.faults, "long stream moved, then its new D SIGKILLed: move %s, answer %s"
                   % (asked.get("status"), r["kind"]))
        log("fault: %s; answer %s" % (what, r["kind"]))
        if killed:
            killed.start()
            if not killed.wait_healthy(60):
                self.violation("%s did not come back after a restart" % killed.name)
            self.must_finish(what, r, ref, entry)
        else:
            self.judge(what, r, ref, entry)

    def fault_kill_before_first_byte(self, _kind):
        """A D SIGSTOPped, a stream of the fault's own sent meanwhile (its leg, if written to the
        stopped D, waits for a status line that never comes), then that D SIGKILLed and restarted:
        the stream is sent again on the other D and equals colocated (docs/router.md, *Retries*)."""
        own = self.own_long_stream()
        if own is None:
            return
        entry, body, ref, mode, rid = own
        body["max_tokens"] = 24
        victim = self.frng.choice(self.D)
        victim.scrape()
        victim.proc.send_signal(signal.SIGSTOP)
        result = {}
        sender = threading.Thread(target=lambda: result.update(r=send(
            self.router.host, self.router.port, body,
            headers={"x-kvpush-mode": mode, "x-request-id": rid})))
        sender.start()
        time.sleep(self.frng.uniform(0.02, 0.3))
        victim.kill()
        sender.join()
        r = result["r"]
        ref24 = send(self.colo.host, self.colo.port, dict(body, stream=False))
        what = "stream %s (%s), %s stopped then SIGKILLed before its first byte" % (
            rid, mode, victim.name)
        self.count(self.faults, "D stopped, then SIGKILLed, before a stream's first byte: "
                   "answer %s" % r["kind"])
        log("fault: %s; answer %s" % (what, r["kind"]))
        victim.start()
        if not victim.wait_healthy(60):
            self.violation("%s did not come back after a restart" % victim.name)
        if ref24["kind"] == "ok":
            self.must_finish(what, r, ref24["ids"], entry)

    def fault_migrate_long(self, kind):
        """A long seeded stream of its own, moved mid-stream by POST /admin/migrate (issue 24);
        `migrate_broken`: every transfer post of both Ds fails (SIGUSR1 ... SIGUSR2) from just
        before the ask until it is answered, so the source's WRITEs of the move fail: the stream
        must stay, or move with its context pushed again or computed, and its tokens equal
        colocated — or it ends in an explicit error."""
        broken = kind == "migrate_broken" and self.fault_flag
        own = self.own_long_stream()
        if own is None:
            return
        entry, body, ref_ids, mode, rid = own
        at = self.frng.randrange(8, 60)
        asked = {}

        def ask():
            if broken:
                for d in self.D:
                    d.proc.send_signal(signal.SIGUSR1)
            try:
                asked["status"], asked["body"] = self.ask_move(rid)
            finally:
                if broken:
                    for d in self.D:
                        d.proc.send_signal(signal.SIGUSR2)

        r = self.stream_asking(body, mode, rid, at, ask)
        status = asked.get("status")
        what = "long stream %s (%s, moved after %d events%s)" % (
            rid, mode, at, ", Ds' posts failing" if broken else "")
        self.count(self.faults, "long stream moved%s: POST /admin/migrate -> %s, answer %s" % (
            " while the Ds' transfer posts fail" if broken else "", status, r["kind"]))
        log("fault: %s: POST /admin/migrate -> %s %s; answer %s" % (
            what, status, (asked.get("body") or "")[:160], r["kind"]))
        if status is not None and status not in (200, 404, 409, 504):
            self.violation("POST /admin/migrate %s: %s %s" % (rid, status, asked.get("body")))
        self.judge(what, r, ref_ids, entry)

    FAULTS = {
        "kill_restart_P": fault_kill_restart, "kill_restart_D": fault_kill_restart,
        "sigstop": fault_sigstop, "sigstop_P": fault_sigstop, "sigstop_D": fault_sigstop,
        "restart_stopped_P": fault_restart_stopped, "orphan_leases": fault_orphan_leases,
        "broken_P": fault_broken, "link_cut": fault_link_cut, "migrate": fault_migrate,
        "migrate_long": fault_migrate_long, "migrate_broken": fault_migrate_long,
        "move_then_kill": fault_move_then_kill, "kill_before_first_byte": fault_kill_before_first_byte,
    }

    def fault_loop(self):
        self.frng = random.Random(self.a.seed ^ 0x5EED)
        kinds = [k for k in self.a.faults.split(",") if k != "link_cut" or self.netns]
        while not self.traffic_done.wait(self.frng.uniform(self.a.fault_gap_s * 0.5,
                                                             self.a.fault_gap_s * 1.5)):
            for inst in self.pd:
                inst.scrape()
            kind = self.frng.choice(kinds)
            self.FAULTS[kind](self, kind)
            for inst in self.instances:
                if inst.proc.poll() is not None:
                    self.violation("%s exited unexpectedly with status %s: %s" % (
                        inst.name, inst.proc.returncode, tail(inst.incarnations[-1]["log"])))
                    return
