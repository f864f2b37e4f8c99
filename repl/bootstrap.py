# forkbox: load the REPL source from fd 4 into module forkbox_repl and run it (main() cleans __main__).
import os, sys, types
m = types.ModuleType('forkbox_repl')
with os.fdopen(4, 'rb') as f: s = f.read()
sys.modules['forkbox_repl'] = m
exec(compile(s, '<forkbox_repl>', 'exec', dont_inherit=True), m.__dict__)
m.main()
