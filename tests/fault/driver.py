"""``python -m bertjax.train`` with one fault injected, for test_faults.py.

  python tests/fault/driver.py --fault=KIND:STEP -- <bertjax.train flags>

KIND:
  kill_before_commit  SIGKILL itself while saving step STEP, after every
                      file is written and before orbax's commit (rename).
  kill_while_writing  SIGKILL itself while step STEP's arrays are being
                      written (the tmp directory exists, the commit does not).
  fill_disk           before saving step STEP, fill the workdir's
                      filesystem (a file ``filler`` beside the workdir).
  notice_at_compile   SIGTERM itself as the train step is compiled, before
                      any step (STEP unused).
  notice_twice        SIGTERM itself once step STEP's checkpoint is asked
                      for, and again while the trainer waits for the
                      checkpoint that notice makes (a scheduler signalling
                      again at its time limit).

Everything else is the real trainer, in a process of its own.
"""

import os
import signal
import sys

from absl import flags

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, REPO)

from bertjax.runtime import checkpoint  # pylint: disable=g-import-not-at-top,wrong-import-position
from bertjax import train  # pylint: disable=g-import-not-at-top,wrong-import-position

_FAULT = flags.DEFINE_string('fault', '', 'KIND:STEP (see the docstring).')


def _kill():
  os.kill(os.getpid(), signal.SIGKILL)


def _inject(kind: str, at: int) -> None:
  if kind == 'kill_before_commit':
    seal = checkpoint.write_manifest

    def write_manifest(step_dir):
      seal(step_dir)
      # A local step's temporary directory, or a bucket's step in place.
      if os.path.basename(step_dir).split('.')[0] == str(at):
        _kill()
    checkpoint.write_manifest = write_manifest
  elif kind == 'kill_while_writing':
    save_iterator = checkpoint.IteratorHandler.save

    def save(self, directory, item=None, args=None):
      if os.path.basename(os.path.dirname(str(directory))).startswith(
          f'{at}.'):
        _kill()
      return save_iterator(self, directory, item=item, args=args)
    checkpoint.IteratorHandler.save = save
  elif kind == 'fill_disk':
    save_state = checkpoint.Checkpointer.save

    def save(self, step, *args, **kwargs):
      if step == at:
        self.wait()   # Step at - 4's save completes on a disk with room.
        workdir = os.path.dirname(self.directory)
        with open(os.path.join(os.path.dirname(workdir), 'filler'), 'wb',
                  buffering=0) as f:
          try:
            while True:
              f.write(b'\0' * (1 << 16))
          except OSError:
            pass
      return save_state(self, step, *args, **kwargs)
    checkpoint.Checkpointer.save = save
  elif kind == 'notice_at_compile':
    compile_steps = train.shard_and_compile

    def shard_and_compile(*args, **kwargs):
      os.kill(os.getpid(), signal.SIGTERM)
      return compile_steps(*args, **kwargs)
    train.shard_and_compile = shard_and_compile
  elif kind == 'notice_twice':
    save_state, close = (checkpoint.Checkpointer.save,
                         checkpoint.Checkpointer.close)
    closed = []

    def save(self, step, *args, **kwargs):
      saved = save_state(self, step, *args, **kwargs)
      if step == at:
        os.kill(os.getpid(), signal.SIGTERM)
      return saved

    def close_under_notice(self):
      if not closed:
        closed.append(True)
        os.kill(os.getpid(), signal.SIGTERM)
      close(self)
    checkpoint.Checkpointer.save = save
    checkpoint.Checkpointer.close = close_under_notice
  else:
    raise ValueError(f'--fault={kind}:{at}: unknown kind.')


def main(argv):
  if _FAULT.value:
    kind, at = _FAULT.value.split(':')
    _inject(kind, int(at))
  train.main(argv)


if __name__ == '__main__':
  from absl import app  # pylint: disable=g-import-not-at-top
  app.run(main)
