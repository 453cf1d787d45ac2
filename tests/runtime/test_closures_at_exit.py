"""Step closures still pending at interpreter exit (after the last ``xm.mark_step``) are run then,
in a fresh interpreter each."""

import subprocess
import sys
import textwrap


def run_script(body):
    script = "import accrewrite.runtime.xla_model as xm\n" + textwrap.dedent(body)
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )


def test_closures_added_after_the_last_step_run_at_exit_in_order():
    done = run_script(
        """
        xm.add_step_closure(print, args=("async, step 1",), run_async=True)
        xm.mark_step()
        xm.add_step_closure(print, args=("sync, after the last step",))
        xm.add_step_closure(print, args=("async, after the last step",), run_async=True)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == [
        "async, step 1", "sync, after the last step", "async, after the last step"
    ]
    assert done.stderr == ""


def test_closures_failing_at_exit_are_reported_on_stderr():
    done = run_script(
        """
        def fail(what):
            raise RuntimeError(what)

        xm.add_step_closure(fail, args=("sync closure failed",))
        xm.add_step_closure(fail, args=("async closure failed",), run_async=True)
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RuntimeError: sync closure failed" in done.stderr
    assert "RuntimeError: async closure failed" in done.stderr
    assert done.stderr.index("sync closure failed") < done.stderr.index("async closure failed")
