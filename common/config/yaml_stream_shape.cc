// Counting a YAML stream's documents with the event parser (see yaml_stream_shape.h).
#include "common/config/yaml_stream_shape.h"

#include <sstream>

#include "yaml-cpp/eventhandler.h"
#include "yaml-cpp/yaml.h"

namespace qlora::config_internal {
namespace {

// Records where the current document starts and where its first node is.
class DocumentMarks : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    start_ = mark.pos;
    first_node_line_ = 0;
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t) override { Node(mark); }
  void OnScalar(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                const std::string&) override {
    Node(mark);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                       YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnSequenceEnd() override {}
  void OnMapStart(const YAML::Mark& mark, const std::string&, YAML::anchor_t,
                  YAML::EmitterStyle::value) override {
    Node(mark);
  }
  void OnMapEnd() override {}

  int start() const { return start_; }
  int first_node_line() const { return first_node_line_; }

 private:
  void Node(const YAML::Mark& mark) {
    if (first_node_line_ == 0) first_node_line_ = mark.line + 1;
  }

  int start_ = -1;
  int first_node_line_ = 0;
};

}  // namespace

YamlStreamShape ScanYamlStream(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  DocumentMarks marks;
  YamlStreamShape shape;
  int previous_start = -1;
  while (parser.HandleNextDocument(marks)) {
    // Every real document consumes at least one token, so the next starts further on.
    if (marks.start() == previous_start) {
      shape.stuck_line = marks.first_node_line();
      return shape;
    }
    previous_start = marks.start();
    if (++shape.documents == 2) shape.second_document_line = marks.first_node_line();
  }
  return shape;
}

}  // namespace qlora::config_internal
