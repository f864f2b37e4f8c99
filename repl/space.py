"""Save and load the REPL's state for a Space (docs/state.md).

The server runs this file's source inside the REPL with
``exec(source, {'_user': globals(), '_path': path, '_mode': 'freeze'|'thaw'})``,
so nothing here lands in the user's globals. It prints one JSON line.

What is kept: cwd, environment, sys.path, the names of imported modules
(imported again on thaw), and every global that cloudpickle can serialise,
pickled together so that globals sharing an object still share it. What
cannot be pickled (sockets, threads, generators, open files, ...) is
listed with the reason.
"""
import json as _json
import os as _os
import sys as _sys


class _Count:
    """A file that only counts: checks that a value pickles without
    holding a second copy of it in memory."""

    def write(self, b):
        # Large buffers come as a PickleBuffer, which has no len().
        return memoryview(b).nbytes


def _user_names(user):
    return [n for n in list(user) if not (n.startswith('__') and n.endswith('__'))]


def _freeze(user, path):
    import cloudpickle
    keep, unsaved = {}, []
    for name in _user_names(user):
        value = user[name]
        try:
            cloudpickle.CloudPickler(_Count(), protocol=5).dump(value)
        except BaseException as e:  # anything can fail in a __reduce__
            reason = ('%s: %s' % (type(e).__name__, e))[:300]
            unsaved.append({'name': name, 'type': type(value).__name__, 'reason': reason})
            continue
        keep[name] = value
    meta = {
        'cwd': _os.getcwd(),
        'env': dict(_os.environ),
        'sys_path': list(_sys.path),
        'modules': sorted((n for n, m in list(_sys.modules.items()) if m is not None), key=lambda n: n.count('.')),
        'unsaved': unsaved,
    }
    _os.makedirs(_os.path.dirname(path), exist_ok=True)
    with open(path, 'wb') as f:
        cloudpickle.dump(meta, f, protocol=5)
        cloudpickle.dump(keep, f, protocol=5)
        f.flush()
        _os.fsync(f.fileno())
    return {'saved': sorted(keep), 'unsaved': unsaved}


def _thaw(user, path):
    import importlib
    import pickle
    failed = []
    if not _os.path.exists(path):
        # Frozen while it had no REPL (one that died and could not be
        # restarted): the files are back, the globals were never saved.
        return {'restored': [], 'unsaved': [], 'failed': [
            {'name': '(globals)', 'type': 'dict', 'reason': 'the sandbox had no running REPL when it was frozen'}]}
    with open(path, 'rb') as f:
        meta = pickle.load(f)
        _sys.path[:] = meta['sys_path']
        env = dict(meta['env'])
        if 'HOSTNAME' in _os.environ:   # the new sandbox's id
            env['HOSTNAME'] = _os.environ['HOSTNAME']
        _os.environ.clear()
        _os.environ.update(env)
        try:
            _os.chdir(meta['cwd'])
        except OSError as e:
            failed.append({'name': '(cwd)', 'type': 'str', 'reason': str(e)[:300]})
        for name in meta['modules']:
            if name not in _sys.modules:
                try:
                    importlib.import_module(name)
                except BaseException:
                    pass  # a module that only existed for a while
        try:
            values = pickle.load(f)
        except BaseException as e:
            values = {}
            failed.append({'name': '(globals)', 'type': 'dict', 'reason': ('%s: %s' % (type(e).__name__, e))[:300]})
    user.update(values)
    import shutil
    shutil.rmtree(_os.path.dirname(path), ignore_errors=True)
    return {'restored': sorted(values), 'unsaved': meta['unsaved'], 'failed': failed}


print(_json.dumps((_freeze if _mode == 'freeze' else _thaw)(_user, _path)))
