"""GPU debug: the fast walk and the retention search on KINDS6's failing scenes, small sizes."""
import gc, sys, dataclasses
import torch
from gpumem_nb.holders import Scanner
from gpumem_nb.holders.retention import RootContext
MB = 2**20
print(torch.__version__, torch.cuda.get_device_name())

def scan(name, ns):
    ns.setdefault("__name__", "__main__")
    for label, kw in (("walk", {}), ("full", dict(rest_min_bytes=0, roots=RootContext(user_ns=ns), allocated_bytes=10**15))):
        s = Scanner()
        hs = s.scan(ns, **kw)
        print(f"== {name} [{label}]")
        for h in hs:
            print(f"   {h.name!r:60} kind={h.kind} {h.nbytes/MB:.1f}MiB path={h.path!r} capped={h.walk_capped} cut={h.cut_note!r}")
        if s.search: print("   search:", s.search.cut, [(r.state, r.path, r.nbytes//MB) for r in s.search.retained][:8])

ns = {"torch": torch}
exec("""
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False, device='cuda') for _ in range(4)])
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=10, gamma=0.5)
x = torch.randn(8, 2048, device='cuda')
model(x).square().mean().backward()
opt.step(); sched.step(); opt.zero_grad(set_to_none=True)
del model, opt, x
""", ns)
st = ns['sched'].optimizer.__dict__.get('state')
print("state type", type(st), len(st), [type(v) for v in list(st.values())[:1]], [ (k, type(v)) for k,v in list(st.values())[0].items()])
print("sched dict keys", list(vars(ns['sched']).keys()))
print("opt dict keys", list(vars(ns['sched'].optimizer).keys()))
scan("lr_scheduler", ns)
del ns, st; gc.collect(); torch.cuda.empty_cache()

ns = {"torch": torch}
exec("""
model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048, bias=False, device='cuda') for _ in range(4)])
x = torch.randn(8, 2048, device='cuda')
loss = model(x).square().mean()
loss.backward(create_graph=True)
del loss, x
""", ns)
scan("create_graph", ns)
p = ns['model'][0].weight
print("grad_fn of grad:", p.grad.grad_fn, "refcount p", sys.getrefcount(p), "referrers", len(gc.get_referrers(p)))
del p
exec("model.zero_grad(set_to_none=True)", ns)
print("after zero_grad alloc MiB", torch.cuda.memory_allocated()/MB)
del ns; gc.collect(); torch.cuda.empty_cache(); print("after del alloc MiB", torch.cuda.memory_allocated()/MB)

ns = {"torch": torch}
exec("""
from torch.utils.checkpoint import checkpoint
width = 1024
block = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)).cuda()
outs = []
for micro in range(3):
    x = torch.randn(4096, width, device='cuda')
    outs.append(checkpoint(block, x, use_reentrant=False))
del x
""", ns)
scan("checkpoint", ns)
g = ns['outs'][0].grad_fn
print("grad_fn", type(g), [a for a in dir(g) if a.startswith('_raw_saved') or a.startswith('_saved')][:10])
for a in dir(g):
    if a.startswith('_raw_saved'):
        sv = getattr(g, a); print(a, type(sv), [m for m in dir(sv) if not m.startswith('__')])
        break
del g, ns; gc.collect(); torch.cuda.empty_cache()
print("end alloc MiB", torch.cuda.memory_allocated()/MB)
ns = {"torch": torch}
exec("""
width = 4096
block = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(), torch.nn.Linear(width, width)).cuda()
from torch.utils.checkpoint import checkpoint
outs = [checkpoint(block, torch.randn(4096, width, device='cuda'), use_reentrant=False) for _ in range(2)]
""", ns)
g = ns['outs'][0].grad_fn
for a in dir(g):
    if a.startswith('_raw_saved'):
        sv = getattr(g, a)
        print(a, type(sv), [m for m in dir(sv) if not m.startswith('__')])
        for m in ('data', 'unpack_hook'):
            try: v = getattr(sv, m); print('  ', m, type(v), getattr(v, '__qualname__', ''), getattr(getattr(v,'__code__',None),'co_freevars',None))
            except Exception as e: print('  ', m, 'raised', type(e).__name__, e)
import torch.utils.checkpoint as C
print([n for n in dir(C) if 'Frame' in n or 'Holder' in n])
del g, ns; gc.collect(); torch.cuda.empty_cache()
