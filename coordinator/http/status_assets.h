// The status page's static files, compiled in (the page loads nothing from elsewhere): one HTML
// shell for both the job list (/) and a job (/jobs/<id>), its script and its style sheet. The
// shell holds no job data; the script fetches it from /api/... and inserts it as text only.
#pragma once

namespace qlora::coordinator {

extern const char kStatusPageHtml[];   // served at / and /jobs/<id>
extern const char kStatusPageJs[];     // /static/status.js
extern const char kStatusPageCss[];    // /static/status.css

// The Content-Security-Policy of every answer: scripts, styles and fetches from this server
// only, no inline script, no frames, no forms that leave the page.
extern const char kStatusPageCsp[];

}  // namespace qlora::coordinator
