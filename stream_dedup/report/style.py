"""The report's style sheet and its one script, inline in the page (page.py)."""

CSS = """
:root{--keep:#3b7dd8;--drop:#e07b39;--reject:#b93a4a;--ink:#1d2330;--muted:#667085;
--line:#d9dde5;--bg:#f6f7f9}
*{box-sizing:border-box}
body{margin:0;font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;color:var(--ink);
background:var(--bg)}
header{background:#1d2330;color:#fff;padding:14px 24px 8px;position:sticky;top:0;z-index:2}
header h1{margin:0;font-size:20px}
.sub{margin:2px 0 6px;color:#c9ced8;font-size:12px;word-break:break-all}
nav a{color:#9cc3ff;margin-right:12px;text-decoration:none}
nav a.minor{font-size:12px;color:#c9ced8}
main{max-width:1280px;margin:0 auto;padding:8px 24px 48px}
section{background:#fff;border:1px solid var(--line);border-radius:6px;padding:12px 18px;
margin:16px 0}
h2{margin:4px 0 10px;font-size:18px}
h3{margin:18px 0 8px;font-size:16px;border-bottom:1px solid var(--line)}
table{border-collapse:collapse}
td,th{padding:3px 12px 3px 0;text-align:left;vertical-align:top}
.totals td.count{text-align:right;font-variant-numeric:tabular-nums}
.totals tr.outcome th{padding-top:8px}
.totals tr.keep th{color:var(--keep)}.totals tr.drop th{color:var(--drop)}
.totals tr.reject th{color:var(--reject)}
.kv{display:grid;grid-template-columns:repeat(auto-fill,minmax(280px,1fr));gap:2px 16px}
.kv b{font-weight:500;color:var(--muted)}
.notes{border-color:#e0b34a;background:#fff8e6}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(520px,1fr));gap:12px}
figure{margin:0}figcaption{color:var(--muted);font-size:12px}
svg.chart{width:100%;height:auto;background:#fff}
svg .t{font-size:11px;fill:#444}svg .axis{stroke:#999}
svg .marker{stroke:#1d2330;stroke-dasharray:4 3}
.pair{border:1px solid var(--line);border-left:4px solid var(--drop);border-radius:4px;
padding:8px 12px;margin:10px 0}
.pair.keep{border-left-color:var(--keep)}
.pair:target{box-shadow:0 0 0 3px #9cc3ff}
.head,.other{word-break:break-all}
.tag{display:inline-block;background:#eef1f6;border-radius:3px;padding:0 6px;font-size:12px}
.score{display:inline-block;margin:4px 12px 0 0;font-variant-numeric:tabular-nums}
.url{color:#1b4fa0}
.sbs{display:grid;grid-template-columns:1fr 1fr;gap:12px;margin-top:6px}
.sbs.one{grid-template-columns:1fr}
.col{background:#fafbfc;border:1px solid var(--line);padding:6px 10px;overflow-wrap:anywhere}
.col h4{margin:0 0 4px;font-size:13px}
.words{margin:0;font-family:ui-serif,Georgia,serif;max-height:24em;overflow:auto}
mark{background:#ffd9a8;padding:0 1px}
.fold{color:var(--muted);font-style:italic;font-size:12px}
.none,.cut,.common{color:var(--muted);font-size:12px;margin:2px 0}
.cut{color:#a05a00}
details.cluster{margin:6px 0}details.cluster ol{margin:4px 0 8px;word-break:break-all}
small{color:var(--muted)}
"""

# "d" jumps to the next side-by-side view ("D" to the one before); the page says how many
# views it holds. Small and written here: the page loads nothing.
SCRIPT = """
(function(){
  var views=Array.prototype.slice.call(document.querySelectorAll("article.pair"));
  var at=-1;
  document.addEventListener("keydown",function(e){
    if((e.key!=="d"&&e.key!=="D")||!views.length){return;}
    at=(at+(e.key==="d"?1:views.length-1))%views.length;
    location.hash=views[at].id;
  });
  document.documentElement.setAttribute("data-views",String(views.length));
})();
"""
