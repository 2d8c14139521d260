"""yard_agg.session against a fake node agent on a Unix socket: join, waiting, membership
changes, failed, refused joins, leave and close (a close without a leave is a gone worker)."""

import os
import sys
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, os.pardir))
sys.path.insert(0, HERE)

from yard_agg import session as agg_session  # noqa: E402
from yard_agg.session import Session, SessionError, parse_line  # noqa: E402
from yard_agg.wire import Geometry  # noqa: E402
from fake_agg import FakeAgent  # noqa: E402


def member(epoch, agg="198.18.0.2:7481", worker=1):
    return {"membership": {"job": 3, "epoch": epoch, "worker": worker, "workers": 4,
                           "aggregator": agg, "values": 1000, "chunk_values": 360,
                           "dtype": "f32", "token": 11, "result_token": 12}}


def wait_for(pred, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in %.1f s" % timeout)
        time.sleep(0.01)


class SessionTest(unittest.TestCase):
    def test_lines_become_states(self):
        s = parse_line('{"membership": {"job": 3, "epoch": 2, "worker": 1, "workers": 4, '
                       '"aggregator": "198.18.0.1:7481", "values": 10, "chunk_values": 360, '
                       '"dtype": "f32", "token": 4294967295, "result_token": 7}}')
        self.assertEqual(s.kind, agg_session.RUNNING)
        m = s.membership
        self.assertEqual((m.job, m.epoch, m.worker, m.workers, m.dtype), (3, 2, 1, 4, "f32"))
        self.assertEqual(m.aggregator, ("198.18.0.1", 7481))
        self.assertEqual(m.geometry, Geometry(10, 360))
        self.assertEqual((m.token, m.result_token), (0xFFFFFFFF, 7))
        self.assertEqual(parse_line('{"waiting": "x"}').kind, agg_session.WAITING)
        f = parse_line('{"failed": "job t failed: worker rank 2 died (it crashed)"}')
        self.assertEqual((f.kind, f.why),
                         (agg_session.FAILED, "job t failed: worker rank 2 died (it crashed)"))
        self.assertEqual(parse_line('{"gone": "the job was deleted"}').why, "the job was deleted")
        self.assertIsNone(parse_line("garbage"))
        r = parse_line('{"ring": {"job": 4, "epoch": 1, "rank": 1, "ranks": [0, 1, 2]}}')
        self.assertEqual(r.kind, agg_session.RING)
        self.assertEqual((r.membership.job, r.membership.rank, r.membership.ranks), (4, 1, [0, 1, 2]))
        self.assertIsNone(parse_line('{"ring": {"job": 4, "epoch": 1, "rank": 1, "ranks": "all"}}'))
        self.assertIsNone(parse_line('{"membership": {"job": -1}}'))
        self.assertIsNone(parse_line('{"membership": {"job": 3, "epoch": 2, "worker": 1, '
                                     '"workers": 4, "aggregator": "x", "values": 10, '
                                     '"chunk_values": 360, "dtype": "f32", "token": 1, '
                                     '"result_token": 2}}'))
        # a membership without its tokens is malformed
        self.assertIsNone(parse_line('{"membership": {"job": 3, "epoch": 2, "worker": 1, '
                                     '"workers": 4, "aggregator": "198.18.0.1:7481", '
                                     '"values": 10, "chunk_values": 360, "dtype": "f32"}}'))

    def test_a_worker_follows_its_job_until_it_fails(self):
        agent = FakeAgent(lambda join: [{"waiting": "waiting for every rank"}, 0.1, member(1),
                                        0.2, member(2, "198.18.0.3:7481"), 0.2,
                                        {"failed": "job t failed: worker rank 0 died"}])
        try:
            s = Session.join("t", 1, ("198.18.0.5", 40001), path=agent.path)
            self.assertEqual(agent.joins, [{"job": "t", "rank": 1, "addr": "198.18.0.5:40001"}])
            m = s.wait_running(5)
            self.assertEqual(m.epoch, 1)
            wait_for(lambda: s.state().kind == agg_session.RUNNING
                     and s.state().membership.epoch == 2)
            self.assertEqual(s.state().membership.aggregator, ("198.18.0.3", 7481))
            wait_for(lambda: s.state().kind == agg_session.FAILED)
            self.assertEqual(s.state().why, "job t failed: worker rank 0 died")
            with self.assertRaises(SessionError) as cm:
                s.wait_running(1)
            self.assertIn("worker rank 0 died", str(cm.exception))
            s.close()
        finally:
            agent.close()

    def test_a_refused_join_says_why(self):
        agent = FakeAgent(lambda join: [{"error": "no job named nope"}])
        try:
            with self.assertRaises(SessionError) as cm:
                Session.join("nope", 0, ("198.18.0.5", 40001), path=agent.path)
            self.assertEqual(str(cm.exception), "the node refused the join: no job named nope")
        finally:
            agent.close()

    def test_an_absent_agent_is_named(self):
        with self.assertRaises(SessionError) as cm:
            Session.join("t", 0, ("198.18.0.5", 1), path="/nonexistent/agg.sock")
        self.assertIn("cannot reach the yard node's aggregation agent at /nonexistent/agg.sock",
                      str(cm.exception))

    def test_waiting_times_out(self):
        agent = FakeAgent(lambda join: [{"waiting": "x"}])
        try:
            s = Session.join("t", 0, ("198.18.0.5", 1), path=agent.path)
            with self.assertRaises(SessionError) as cm:
                s.wait_running(0.2)
            self.assertIn("job not running after 0.2 s", str(cm.exception))
            s.close()
        finally:
            agent.close()

    def test_leave_is_clean_and_close_is_a_gone_worker(self):
        agent = FakeAgent(lambda join: [member(1, worker=join["rank"])])
        try:
            a = Session.join("t", 0, ("198.18.0.5", 1), path=agent.path)
            b = Session.join("t", 1, ("198.18.0.6", 1), path=agent.path)
            a.wait_running(5)
            b.wait_running(5)
            a.leave()
            self.assertEqual(a.state().kind, agg_session.CLOSED)
            self.assertEqual(a.state().why, "left the job")
            b.close()
            wait_for(lambda: agent.closed == [1])
            self.assertEqual(agent.leaves, [0])
        finally:
            agent.close()


if __name__ == "__main__":
    unittest.main()
