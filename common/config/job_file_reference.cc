// Renders the job-file key table as Markdown and plain text (see job_file_reference.h).
#include "common/config/job_file_reference.h"




#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "common/config/job_config_schema.h"

namespace qlora {
namespace {

using config_internal::JobFileSchema;
using config_internal::SchemaNode;

std::string Join(const std::string& prefix, const std::string& key) {
  return prefix.empty() ? key : absl::StrCat(prefix, ".", key);
}

std::string DefaultText(const SchemaNode& node) {
  if (!node.default_value.empty()) return absl::StrCat("`", node.default_value, "`");
  return node.default_note;
}

std::string Meaning(const SchemaNode& node) {
  if (!node.refused_because.empty()) return absl::StrCat("refused: ", node.refused_because);
  return node.doc;
}

// A Markdown table cell: pipes escaped, one line.
std::string Cell(const std::string& text) {
  return absl::StrReplaceAll(text, {{"|", "\\|"}, {"\n", " "}});
}

void MarkdownRows(const SchemaNode& node, const std::string& path, std::string* out) {
  absl::StrAppend(out, "| `", path, "` | ", Cell(node.type), " | ", Cell(DefaultText(node)),
                  " | ", Cell(Meaning(node)), " | ", node.origin, " |\n");
  for (const SchemaNode& child : node.children) {
    MarkdownRows(child, Join(path, child.key), out);
  }
}

void TextLine(const SchemaNode& node, const std::string& path, std::string* out) {
  std::string line = absl::StrCat("  ", path);
  if (!node.type.empty()) absl::StrAppend(&line, "  (", node.type, ")");
  const std::string default_text = DefaultText(node);
  if (!default_text.empty()) absl::StrAppend(&line, "  default ", default_text);
  const std::string meaning = Meaning(node);
  if (!meaning.empty()) absl::StrAppend(&line, ": ", meaning);
  absl::StrAppend(out, line, "\n");
}

}  // namespace

std::string JobFileReferenceMarkdown() {
  std::string out =
      "# Job-file reference\n\n"
      "<!-- Generated from common/config/job_config_schema.cc by `qloractl explain --markdown`;\n"
      "     edit the schema, not this file (ConfigTest.JobFileReferenceMatchesTheSchema). -->\n\n"
      "Every key the job file accepts, with its type, its default as `qloractl validate` "
      "resolves it, what it does and whose key it is (Ludwig, DeepSpeed, PEFT and bitsandbytes "
      "keys are accepted as those projects write them). Refused keys are listed with the "
      "reason. `qloractl explain KEY` prints one key; an unknown key in a job file is an error "
      "that names the closest valid one.\n";
  constexpr char kHeader[] = "| key | type | default | meaning | from |\n|---|---|---|---|---|\n";
  absl::StrAppend(&out, "\n## Top level\n\n", kHeader);
  for (const SchemaNode& key : JobFileSchema().children) {
    if (key.children.empty()) MarkdownRows(key, key.key, &out);
  }
  for (const SchemaNode& section : JobFileSchema().children) {
    if (section.children.empty()) continue;
    absl::StrAppend(&out, "\n## `", section.key, "`\n\n");
    if (!section.origin.empty()) absl::StrAppend(&out, "From ", section.origin, ". ");
    absl::StrAppend(&out, section.type, section.doc.empty() ? "" : ": ", section.doc, ".\n\n");
    absl::StrAppend(&out, kHeader);
    for (const SchemaNode& child : section.children) {
      MarkdownRows(child, Join(section.key, child.key), &out);
    }
  }
  return out;
}

absl::StatusOr<std::string> ExplainJobFileKey(const std::string& path) {
  const SchemaNode* node = &JobFileSchema();
  std::string walked;
  if (!path.empty()) {
    for (const absl::string_view part : absl::StrSplit(path, '.')) {
      const SchemaNode* child = node->Child(std::string(part));
      if (child == nullptr) {
        return absl::NotFoundError(absl::StrCat(
            Join(walked, std::string(part)), ": ",
            config_internal::UnknownKeyProblem(*node, walked, std::string(part))));
      }
      walked = Join(walked, std::string(part));
      node = child;
    }
  }
  std::string out;
  if (path.empty()) {
    out = "The job file's top-level keys (qloractl explain KEY for one):\n";
  } else {
    TextLine(*node, path, &out);
    out = out.substr(2);  // the key itself is not indented
    if (!node->children.empty()) absl::StrAppend(&out, "Keys:\n");
  }
  for (const SchemaNode& child : node->children) TextLine(child, Join(path, child.key), &out);
  return out;
}

}  // namespace qlora
