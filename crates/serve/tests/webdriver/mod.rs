//! The few W3C WebDriver commands the browser test sends, as blocking JSON requests (ureq, which
//! the API tests use already).
//!
//! Not fantoccini: its `webdriver` dependency brings ICU, whose derive macros turn on `syn`'s
//! `fold` feature, and a test build with that feature recompiles every procedural macro and so
//! Burn, which `cargo run --release --bin train` had just compiled.

use std::time::Duration;

use base64::Engine as _;
use serde_json::{Value, json};

/// The key under which WebDriver returns an element's id.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A WebDriver command that failed: the endpoint's error, or the transport's.
pub type Error = String;

/// A browser session, ended when dropped.
pub struct Session {
    agent: ureq::Agent,
    url: String,
}

/// An element found in the page.
pub struct Element<'a> {
    session: &'a Session,
    id: String,
}

impl Session {
    /// Opens a session on the WebDriver server at `driver` with these capabilities, waiting up to
    /// 10 s for the server to listen.
    pub fn connect(driver: &str, capabilities: Value) -> Session {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(Duration::from_secs(60)))
            .build()
            .into();
        let body = json!({ "capabilities": { "alwaysMatch": capabilities } });
        let mut last = String::new();
        for _ in 0..100 {
            match send(&agent, "POST", &format!("{driver}/session"), Some(&body)) {
                Ok(value) => {
                    let id = value["sessionId"]
                        .as_str()
                        .expect("a session id")
                        .to_string();
                    return Session {
                        agent,
                        url: format!("{driver}/session/{id}"),
                    };
                }
                Err(e) => last = e,
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("cannot open a WebDriver session at {driver}: {last}")
    }

    fn post(&self, path: &str, body: Value) -> Result<Value, Error> {
        send(
            &self.agent,
            "POST",
            &format!("{}{path}", self.url),
            Some(&body),
        )
    }

    fn get(&self, path: &str) -> Result<Value, Error> {
        send(&self.agent, "GET", &format!("{}{path}", self.url), None)
    }

    pub fn goto(&self, url: &str) -> Result<(), Error> {
        self.post("/url", json!({ "url": url })).map(drop)
    }

    /// The first element matching the CSS selector.
    pub fn find(&self, css: &str) -> Result<Element<'_>, Error> {
        let found = self.post("/element", json!({ "using": "css selector", "value": css }))?;
        Ok(self.element(&found))
    }

    /// Every element matching the CSS selector, in document order.
    pub fn find_all(&self, css: &str) -> Result<Vec<Element<'_>>, Error> {
        let found = self.post(
            "/elements",
            json!({ "using": "css selector", "value": css }),
        )?;
        let found = found.as_array().ok_or("elements: not a list")?;
        Ok(found.iter().map(|e| self.element(e)).collect())
    }

    fn element(&self, found: &Value) -> Element<'_> {
        let id = found[ELEMENT].as_str().expect("an element id").to_string();
        Element { session: self, id }
    }

    /// Runs `script` (a function body) in the page; what it returns.
    pub fn execute(&self, script: &str) -> Result<Value, Error> {
        self.post("/execute/sync", json!({ "script": script, "args": [] }))
    }

    /// The page as a PNG.
    pub fn screenshot(&self) -> Result<Vec<u8>, Error> {
        let png = self.get("/screenshot")?;
        base64::engine::general_purpose::STANDARD
            .decode(png.as_str().ok_or("screenshot: not text")?)
            .map_err(|e| e.to_string())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = send(&self.agent, "DELETE", &self.url, None);
    }
}

impl Element<'_> {
    fn path(&self, what: &str) -> String {
        format!("/element/{}/{what}", self.id)
    }

    /// The element's rendered text.
    pub fn text(&self) -> Result<String, Error> {
        let text = self.session.get(&self.path("text"))?;
        Ok(text.as_str().unwrap_or_default().to_string())
    }

    /// The attribute's value, or None when the element has no such attribute.
    pub fn attr(&self, name: &str) -> Result<Option<String>, Error> {
        let value = self.session.get(&self.path(&format!("attribute/{name}")))?;
        Ok(value.as_str().map(String::from))
    }

    pub fn click(&self) -> Result<(), Error> {
        self.session.post(&self.path("click"), json!({})).map(drop)
    }

    /// Moves the mouse over the element's centre (WebDriver's actions), as a user hovering.
    pub fn hover(&self) -> Result<(), Error> {
        let mut origin = serde_json::Map::new();
        origin.insert(ELEMENT.into(), json!(self.id));
        let body = json!({"actions": [{
            "type": "pointer",
            "id": "mouse",
            "parameters": {"pointerType": "mouse"},
            "actions": [{"type": "pointerMove", "duration": 0, "x": 0, "y": 0, "origin": origin}],
        }]});
        self.session.post("/actions", body).map(drop)
    }

    pub fn clear(&self) -> Result<(), Error> {
        self.session.post(&self.path("clear"), json!({})).map(drop)
    }

    pub fn send_keys(&self, text: &str) -> Result<(), Error> {
        let body = json!({ "text": text });
        self.session.post(&self.path("value"), body).map(drop)
    }
}

/// One command: the `value` the server answered, or its error's message.
fn send(
    agent: &ureq::Agent,
    method: &str,
    url: &str,
    body: Option<&Value>,
) -> Result<Value, Error> {
    let response = match (method, body) {
        ("POST", Some(body)) => agent.post(url).send_json(body),
        ("DELETE", _) => agent.delete(url).call(),
        _ => agent.get(url).call(),
    };
    let mut response = response.map_err(|e| format!("{method} {url}: {e}"))?;
    let status = response.status();
    let mut answer: Value = response
        .body_mut()
        .read_json()
        .map_err(|e| format!("{method} {url}: {e}"))?;
    let value = answer["value"].take();
    if status.is_success() {
        Ok(value)
    } else {
        Err(format!(
            "{method} {url}: {status} {} {}",
            value["error"].as_str().unwrap_or(""),
            value["message"].as_str().unwrap_or("")
        ))
    }
}
